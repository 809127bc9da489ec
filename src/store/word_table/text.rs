//! Short `String` keys kept inside their slot: a `KeyedLimiter<String, _>` looked up by `&str`
//! reads no memory beyond the table's own for a key of up to [`INLINE`] bytes, and holds no heap
//! block for it. (Texts of up to 71 bytes go to tables of wider slots: `texts.rs`; longer
//! ones stay `String`s, in this table.)
//!
//! The table is generic over its key type, and stable Rust cannot give `String` a slot layout of
//! its own, so the table asks at run time (a comparison of type ids the compiler folds away)
//! whether `K` is `String`. If it is, a key of up to [`INLINE`] bytes is written into the
//! slot's 24 bytes as its length and bytes instead of as a `String`, and its tag says so
//! ([`INLINE_BIT`], one of the tag's hash bits given up). The class is a function of the text
//! (a text that fits is always inline), so a lookup knows which tag to look for from its own
//! length, and an inline key is never compared with a heap one.

use std::mem::size_of;

/// The longest text kept inline: a `String`'s bytes less the length byte.
pub(super) const INLINE: usize = size_of::<String>() - 1;

/// The tag bit of an inline key, in a table of `String` keys (a table of any other key type
/// uses all seven of the tag's low bits for the hash).
pub(super) const INLINE_BIT: u8 = 0x40;

/// Whether the table's keys are `String`s, whose short values it keeps inline.
#[inline(always)]
pub(super) fn inline_strings<K>() -> bool {
    typeid::of::<K>() == typeid::of::<String>()
}

/// `key`'s text, if a table of `String` keys can read it: `Q` is `str` or `String` (what a
/// `String` borrows as, but for a caller's own `Borrow` impl).
#[inline(always)]
pub(super) fn query_text<Q: ?Sized>(key: &Q) -> Option<&str> {
    if typeid::of::<Q>() == typeid::of::<str>() {
        // SAFETY: `Q` is `str` (lifetimes aside, which `&Q` keeps), so `&Q` is a `&str`: the
        // same type, size and metadata.
        #[allow(unsafe_code)]
        Some(unsafe { std::mem::transmute_copy::<&Q, &str>(&key) })
    } else if typeid::of::<Q>() == typeid::of::<String>() {
        // SAFETY: `Q` is `String`, so `&Q` is a `&String`.
        #[allow(unsafe_code)]
        Some(unsafe { std::mem::transmute_copy::<&Q, &String>(&key) }.as_str())
    } else {
        None
    }
}

/// `text`, if it is kept inline.
#[inline(always)]
pub(super) fn fits(text: &str) -> Option<&str> {
    (text.len() <= INLINE).then_some(text)
}

/// A key to write into a slot: a key, or a text kept inline (in a table of `String` keys).
pub(super) enum NewKey<'q, K> {
    Key(K),
    Text(&'q str),
}

impl<'q, K> NewKey<'q, K> {
    /// The key to write for a lookup of `key`: its text when it fits inline (no `String` is
    /// made), else `key.to_owned()`, whose text is kept inline if it fits (a caller's own
    /// `Borrow` type).
    #[inline]
    pub(super) fn of<Q>(key: &'q Q) -> NewKey<'q, K>
    where
        Q: ?Sized + ToOwned<Owned = K>,
    {
        if inline_strings::<K>() {
            if let Some(text) = query_text(key).and_then(fits) {
                return NewKey::Text(text);
            }
        }
        NewKey::Key(key.to_owned())
    }
}

/// A slot's key as a table holds it.
pub(super) enum Held<'t, K> {
    Key(&'t K),
    /// A short key of a table of `String` keys.
    Text(&'t str),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_string_keys_are_kept_inline() {
        assert!(inline_strings::<String>());
        assert!(!inline_strings::<&str>());
        assert!(!inline_strings::<Box<str>>());
        assert!(!inline_strings::<u64>());
    }

    #[test]
    fn a_query_text_is_read_from_str_and_string_only() {
        assert_eq!(query_text("abc"), Some("abc"));
        assert_eq!(query_text(&String::from("abc")), Some("abc"));
        assert_eq!(query_text(&"abc"), None, "a &&str is not asked for");
        assert_eq!(query_text(&7u64), None);
        assert_eq!(fits(&"k".repeat(INLINE)).map(str::len), Some(23));
        assert_eq!(fits(&"k".repeat(INLINE + 1)), None);
    }

    #[test]
    fn a_new_key_is_text_when_it_fits_and_owned_otherwise() {
        assert!(matches!(
            NewKey::<String>::of("short"),
            NewKey::Text("short")
        ));
        let long = "k".repeat(INLINE + 1);
        assert!(matches!(NewKey::<String>::of(long.as_str()), NewKey::Key(k) if k == long));
        assert!(matches!(NewKey::<u64>::of(&7), NewKey::Key(7)));
    }
}
