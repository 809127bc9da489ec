//! [`TextKey`]: a text key whose short values live inline, in the store's own slot.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;

/// The longest text held inline: 40 bytes less the length byte and the enum's tag.
const INLINE: usize = 38;

/// A text key (a client address as text, an API key, a user name) that keeps text of up to
/// [`TextKey::INLINE_CAPACITY`] bytes inside itself, and longer text on the heap.
///
/// **Why.** A store finds a key by comparing it with the key it holds. The word table keeps a
/// `String` key of up to 23 bytes inline in its slot by itself (a `KeyedLimiter<String>`
/// looked up by `&str` needs nothing more), but a longer `String` keeps its bytes on the heap,
/// where every check reads them: a dependent cache miss after the table's own, on every check
/// of a key set larger than the caches. A `TextKey` of up to 38 bytes sits whole in the
/// table's slot, next to the key's state, so a check reads no other memory. Every IPv4
/// address as text fits, and IPv6 addresses in their usual compressed form (up to 38
/// characters; only the longest forms, 39 to 45 characters, go to the heap). Take it for keys
/// of 24 to 38 bytes; for shorter ones a `String` does as well.
///
/// A `TextKey` takes 40 bytes in its slot, a `String` 24 (plus a heap block when longer than
/// 23 bytes).
///
/// Equal texts make equal keys. Look keys up by `&TextKey` (`KeyedLimiter::check` makes a
/// missing key from its argument, which a `&str` cannot give without a `String`); building a
/// `TextKey` from a `&str` of up to 38 bytes copies it and allocates nothing.
///
/// # Examples
/// ```
/// use tollgate::{Gcra, KeyedLimiter, Quota, TextKey};
/// let limiter = KeyedLimiter::<TextKey, _>::new(Gcra::new(Quota::per_second(1)?)?);
/// let client = TextKey::new("203.0.113.7"); // e.g. the value of a header
/// assert!(limiter.check(&client).unwrap().allowed());
/// assert!(!limiter.check(&client).unwrap().allowed());
/// assert!(client.is_inline());
/// assert_eq!(client.as_str(), "203.0.113.7");
/// # Ok::<(), tollgate::QuotaError>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct TextKey(Repr);

/// The representation depends only on the text's length, so equal texts are equal
/// representations, and the derived equality compares texts.
#[derive(Clone, PartialEq, Eq)]
enum Repr {
    /// `bytes[..len]` is the text (valid UTF-8: it was copied from a `str`), the rest zeros.
    Inline { len: u8, bytes: [u8; INLINE] },
    /// Longer than [`INLINE`] bytes.
    Heap(Box<str>),
}

impl TextKey {
    /// The longest text, in bytes, a `TextKey` holds without a heap allocation.
    pub const INLINE_CAPACITY: usize = INLINE;

    /// A key for `text`: inline up to [`TextKey::INLINE_CAPACITY`] bytes, else on the heap.
    ///
    /// # Examples
    /// ```
    /// use tollgate::TextKey;
    /// assert!(TextKey::new("2001:db8::8a2e:370:7334").is_inline());
    /// assert!(!TextKey::new(&"k".repeat(39)).is_inline());
    /// ```
    pub fn new(text: &str) -> TextKey {
        match Self::inline(text) {
            Some(key) => key,
            None => TextKey(Repr::Heap(text.into())),
        }
    }

    /// `text` inline, if it fits.
    fn inline(text: &str) -> Option<TextKey> {
        let len = u8::try_from(text.len())
            .ok()
            .filter(|&n| usize::from(n) <= INLINE)?;
        let mut bytes = [0; INLINE];
        bytes[..text.len()].copy_from_slice(text.as_bytes());
        Some(TextKey(Repr::Inline { len, bytes }))
    }

    /// The text's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            // (`len` is at most INLINE: `get` never misses; it only spares a panic path.)
            Repr::Inline { len, bytes } => bytes.get(..usize::from(*len)).unwrap_or_default(),
            Repr::Heap(text) => text.as_bytes(),
        }
    }

    /// The text.
    ///
    /// An inline key's bytes are checked as UTF-8 on each call (they were copied from a
    /// `str`, so the check always passes; `TextKey` has no `unsafe` to skip it). Hashing and
    /// comparing keys use [`TextKey::as_bytes`], which checks nothing.
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Inline { .. } => std::str::from_utf8(self.as_bytes()).unwrap_or_default(),
            Repr::Heap(text) => text,
        }
    }

    /// The text's length in bytes.
    pub fn len(&self) -> usize {
        self.as_bytes().len()
    }

    /// Whether the text is empty.
    pub fn is_empty(&self) -> bool {
        self.as_bytes().is_empty()
    }

    /// Whether the text is held inline (at most [`TextKey::INLINE_CAPACITY`] bytes).
    pub fn is_inline(&self) -> bool {
        matches!(self.0, Repr::Inline { .. })
    }
}

/// Hashes the text's bytes, then `0xff` (prefix-free, as `str` does), without checking them.
impl Hash for TextKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(self.as_bytes());
        state.write_u8(0xff);
    }
}

/// By text, as `str` orders (bytewise).
impl Ord for TextKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl PartialOrd for TextKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq<str> for TextKey {
    fn eq(&self, other: &str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl PartialEq<&str> for TextKey {
    fn eq(&self, other: &&str) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl From<&str> for TextKey {
    fn from(text: &str) -> TextKey {
        TextKey::new(text)
    }
}

impl From<&String> for TextKey {
    fn from(text: &String) -> TextKey {
        TextKey::new(text)
    }
}

/// Reuses the `String`'s allocation when the text is too long to sit inline.
impl From<String> for TextKey {
    fn from(text: String) -> TextKey {
        match TextKey::inline(&text) {
            Some(key) => key,
            None => TextKey(Repr::Heap(text.into_boxed_str())),
        }
    }
}

impl From<Box<str>> for TextKey {
    fn from(text: Box<str>) -> TextKey {
        match TextKey::inline(&text) {
            Some(key) => key,
            None => TextKey(Repr::Heap(text)),
        }
    }
}

impl From<Cow<'_, str>> for TextKey {
    fn from(text: Cow<'_, str>) -> TextKey {
        match text {
            Cow::Borrowed(text) => TextKey::new(text),
            Cow::Owned(text) => TextKey::from(text),
        }
    }
}

impl From<TextKey> for String {
    fn from(key: TextKey) -> String {
        match key.0 {
            Repr::Heap(text) => text.into_string(),
            Repr::Inline { .. } => key.as_str().to_owned(),
        }
    }
}

/// Never fails: every text makes a key (for `str::parse` and configuration readers).
impl FromStr for TextKey {
    type Err = std::convert::Infallible;
    fn from_str(text: &str) -> Result<TextKey, Self::Err> {
        Ok(TextKey::new(text))
    }
}

impl AsRef<[u8]> for TextKey {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl Default for TextKey {
    /// The empty text.
    fn default() -> TextKey {
        TextKey::new("")
    }
}

impl fmt::Display for TextKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for TextKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::hash::BuildHasher;

    /// One hasher state for the whole test run, so equal inputs hash alike.
    fn hash_of<T: Hash + ?Sized>(value: &T) -> u64 {
        static STATE: std::sync::OnceLock<std::collections::hash_map::RandomState> =
            std::sync::OnceLock::new();
        STATE.get_or_init(Default::default).hash_one(value)
    }

    #[test]
    fn forty_bytes_and_inline_up_to_the_capacity() {
        assert_eq!(std::mem::size_of::<TextKey>(), 40);
        let fits = "a".repeat(TextKey::INLINE_CAPACITY);
        let over = "a".repeat(TextKey::INLINE_CAPACITY + 1);
        assert!(TextKey::new(&fits).is_inline());
        assert!(!TextKey::new(&over).is_inline());
        assert!(TextKey::from(over.clone()).as_str() == over);
        // The longest IPv4 text and a compressed IPv6 address fit.
        assert!(TextKey::new("255.255.255.255").is_inline());
        assert!(TextKey::new("2001:db8:85a3::8a2e:370:7334").is_inline());
    }

    #[test]
    fn every_conversion_gives_the_same_key() {
        for text in ["", "x", &"y".repeat(38), &"z".repeat(39), &"ü".repeat(25)] {
            let key = TextKey::new(text);
            assert_eq!(key, TextKey::from(text.to_owned()));
            assert_eq!(key, TextKey::from(Box::<str>::from(text)));
            assert_eq!(key, TextKey::from(Cow::Borrowed(text)));
            assert_eq!(key, text.parse::<TextKey>().unwrap());
            assert_eq!(String::from(key.clone()), text);
            assert_eq!(key.to_string(), text);
            assert_eq!(format!("{key:?}"), format!("{text:?}"));
            assert_eq!(key.len(), text.len());
            assert_eq!(key, text);
        }
        assert!(TextKey::default().is_empty());
    }

    proptest! {
        /// A `TextKey` behaves as its `String`: the same text back, equal and ordered alike,
        /// equal keys hashing alike.
        #[test]
        fn behaves_as_its_string(a in ".{0,50}", b in ".{0,50}") {
            let (ka, kb) = (TextKey::new(&a), TextKey::new(&b));
            prop_assert_eq!(ka.as_str(), a.as_str());
            prop_assert_eq!(ka.is_inline(), a.len() <= INLINE);
            prop_assert_eq!(ka == kb, a == b);
            prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
            if a == b {
                prop_assert_eq!(hash_of(&ka), hash_of(&kb));
            }
        }
    }
}
