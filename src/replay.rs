//! Trace replay (filled in below).
