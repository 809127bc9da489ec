//! `String` keys of 24 to 71 bytes kept inline too, in word tables of wider
//! slots: API keys, UUIDs and tokens are compared in the slot a lookup already reads, not
//! through a pointer to heap text (a second cache miss at a million keys).
//!
//! A table's slot size is its key type's, and stable Rust cannot give `String` a wider one, so
//! a table of `String` keys keeps, beside its own table (texts of up to 23 bytes inline,
//! `text.rs`; texts of 72 bytes or more on the heap), two tables keyed by fixed inline texts,
//! [`InlineText`]`<`[`MID`]`>` (a 48-byte slot of a word cell) and `InlineText<`[`LONG`]`>`
//! (80 bytes), made with its first key of their lengths. The class is a function of the text's
//! length, so a lookup by `&str` or `&String` goes to exactly one table, and two texts are
//! compared only within a class: never one cell for two keys.
//!
//! A caller's own `Borrow` type for `String` shows no text, so its lookups ask every class,
//! each comparing the held text (turned into a `String`) with the key ([`AnyText`]); its
//! inserts make the `String` first.

use std::borrow::Borrow;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;

use super::super::cell::TableCell;
use super::shards::WordTable;
use super::slots::owned_string;
use super::text::{inline_strings, query_text, INLINE};

/// The bytes of a middle-class text (24 to 39 bytes) with its length: a 48-byte slot beside a
/// one-word cell.
pub(super) const MID: usize = 40;
/// The bytes of a long-class text (40 to 71 bytes) with its length: an 80-byte slot.
pub(super) const LONG: usize = 72;
/// The shortest text of the middle class: one more than the table's own slot holds.
pub(super) const MID_FROM: usize = INLINE + 1;
/// The shortest text of the long class.
const LONG_FROM: usize = MID;

/// A text of up to `N − 1` bytes, inline: its bytes, zeros, and its length in the last byte.
/// `N` is a multiple of 8, so that two are compared a word at a time (a `memcmp` call, as
/// arrays of bytes compared, was a sixth of a check's time).
#[derive(Clone, Copy)]
pub(crate) struct InlineText<const N: usize> {
    bytes: [u8; N],
}

impl<const N: usize> InlineText<N> {
    const WHOLE_WORDS: () = assert!(N % 8 == 0 && N <= 256);

    /// `text`, which fits (`text.len() < N`).
    #[inline]
    fn new(text: &str) -> Self {
        let () = Self::WHOLE_WORDS;
        assert!(
            text.len() < N,
            "an inline text is shorter than its {N} bytes"
        );
        let mut bytes = [0; N];
        bytes[..text.len()].copy_from_slice(text.as_bytes());
        bytes[N - 1] = text.len() as u8;
        InlineText { bytes }
    }

    #[inline]
    fn as_str(&self) -> &str {
        let bytes = &self.bytes[..usize::from(self.bytes[N - 1])];
        // SAFETY: `new`, the only constructor, copied these bytes from a `str`: valid UTF-8.
        #[allow(unsafe_code)]
        unsafe {
            std::str::from_utf8_unchecked(bytes)
        }
    }
}

/// Equal texts are equal arrays (zeros after the text, the length last): compared as words,
/// with no branch but the last.
impl<const N: usize> PartialEq for InlineText<N> {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        let word = |bytes: &[u8]| u64::from_ne_bytes(bytes.try_into().expect("8 bytes"));
        let pairs = self.bytes.chunks_exact(8).zip(other.bytes.chunks_exact(8));
        pairs.fold(0, |differ, (a, b)| differ | (word(a) ^ word(b))) == 0
    }
}

impl<const N: usize> Eq for InlineText<N> {}

/// Hashed as its `str` is, so that a caller's `Borrow` type, which hashes as the `String`
/// (the `Borrow` contract), finds it.
impl<const N: usize> Hash for InlineText<N> {
    #[inline]
    fn hash<S: Hasher>(&self, state: &mut S) {
        self.as_str().hash(state);
    }
}

/// The wider tables of a table of `String` keys.
pub(super) struct Texts<H, C: TableCell> {
    pub(super) mid: WordTable<InlineText<MID>, H, C>,
    pub(super) long: WordTable<InlineText<LONG>, H, C>,
}

/// Which table holds a key of a table of `K` keys.
pub(super) enum Class {
    /// The table's own (every key of a table of other keys than `String`).
    Own,
    Mid(InlineText<MID>),
    Long(InlineText<LONG>),
    /// A caller's own `Borrow` type: any.
    Unknown,
}

/// The class of `key`, looked up in a table of `K` keys.
#[inline(always)]
pub(super) fn class<K, Q: ?Sized>(key: &Q) -> Class {
    if !inline_strings::<K>() {
        return Class::Own;
    }
    match query_text(key) {
        Some(text) => match text.len() {
            MID_FROM..MID => Class::Mid(InlineText::new(text)),
            LONG_FROM..LONG => Class::Long(InlineText::new(text)),
            _ => Class::Own,
        },
        None => Class::Unknown,
    }
}

/// A key as a wider table's lookup compares it: an [`InlineText`], or a caller's own `Borrow`
/// type for `String` ([`Foreign`]), which shows no text but can be compared with one.
pub(super) trait AnyText {
    /// The text, if the key shows it.
    fn text(&self) -> Option<&str>;
    /// Whether the key is `text`.
    fn is(&self, text: &str) -> bool;
    fn hash_dyn(&self, state: &mut dyn Hasher);
}

impl<const N: usize> AnyText for InlineText<N> {
    fn text(&self) -> Option<&str> {
        Some(self.as_str())
    }

    fn is(&self, text: &str) -> bool {
        self.as_str() == text
    }

    fn hash_dyn(&self, mut state: &mut dyn Hasher) {
        self.hash(&mut state);
    }
}

impl PartialEq for dyn AnyText + '_ {
    fn eq(&self, other: &Self) -> bool {
        match (self.text(), other.text()) {
            (Some(a), Some(b)) => a == b,
            (Some(a), None) => other.is(a),
            (None, Some(b)) => self.is(b),
            (None, None) => false,
        }
    }
}

impl Eq for dyn AnyText + '_ {}

impl Hash for dyn AnyText + '_ {
    fn hash<S: Hasher>(&self, state: &mut S) {
        self.hash_dyn(state);
    }
}

impl<'a, const N: usize> Borrow<dyn AnyText + 'a> for InlineText<N> {
    fn borrow(&self) -> &(dyn AnyText + 'a) {
        self
    }
}

/// A lookup key of a caller's own `Borrow` type `Q` for `K` (which is `String`).
pub(super) struct Foreign<'q, K, Q: ?Sized> {
    key: &'q Q,
    _owned: PhantomData<fn() -> K>,
}

impl<'q, K, Q: ?Sized> Foreign<'q, K, Q> {
    pub(super) fn new(key: &'q Q) -> Self {
        Foreign {
            key,
            _owned: PhantomData,
        }
    }
}

impl<K: Borrow<Q>, Q: Hash + Eq + ?Sized> AnyText for Foreign<'_, K, Q> {
    fn text(&self) -> Option<&str> {
        None
    }

    /// A `String` made of `text`, borrowed as `Q`: off the path of `&str` and `&String`
    /// lookups, which never come here.
    fn is(&self, text: &str) -> bool {
        owned_string::<K>(text).borrow() == self.key
    }

    fn hash_dyn(&self, mut state: &mut dyn Hasher) {
        self.key.hash(&mut state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn a_text_goes_to_the_class_of_its_length() {
        let of = |len: usize| match class::<String, str>(&"k".repeat(len)) {
            Class::Own => "own",
            Class::Mid(t) => {
                assert_eq!(t.as_str().len(), len);
                "mid"
            }
            Class::Long(t) => {
                assert_eq!(t.as_str().len(), len);
                "long"
            }
            Class::Unknown => "unknown",
        };
        assert_eq!(
            [0, 23, 24, 39, 40, 71, 72, 500].map(of),
            ["own", "own", "mid", "mid", "long", "long", "own", "own"]
        );
        assert!(matches!(class::<u64, u64>(&7), Class::Own));
        assert!(matches!(
            class::<String, String>(&"k".repeat(30)),
            Class::Mid(_)
        ));
    }

    #[test]
    fn an_inline_text_hashes_and_compares_as_its_str() {
        let hasher = foldhash::fast::FixedState::with_seed(3);
        let uuid = "67e55044-10b1-426f-9247-bb680e5fe0c8";
        let text = InlineText::<MID>::new(uuid);
        assert_eq!(text.as_str(), uuid);
        assert_eq!(hasher.hash_one(text), hasher.hash_one(uuid));
        assert_eq!(hasher.hash_one(text), hasher.hash_one(uuid.to_string()));
        let any: &dyn AnyText = &text;
        assert_eq!(hasher.hash_one(any), hasher.hash_one(uuid));
        assert!(text != InlineText::new(&uuid[1..]));
        assert!(text != InlineText::new(&uuid[..35]));
        // Multi-byte text, to its last byte.
        let word = "ñandú-ñandú-ñandú-ñandú-ñ";
        assert_eq!(InlineText::<MID>::new(word).as_str(), word);
    }
}
