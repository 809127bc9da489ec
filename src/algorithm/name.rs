//! The algorithms by name: one enum that replay, the CLI, the tower layer's configuration and
//! the Redis tier all read, so that a name means one algorithm everywhere and an unknown name is
//! an error, never a default.

use std::fmt;
use std::str::FromStr;

/// The algorithms by the names of [`docs::decision_rules`](crate::docs::decision_rules).
///
/// # Examples
/// ```
/// use tollgate::AlgorithmName;
/// // The names `tollgate replay --algorithm` and configuration files accept.
/// let name: AlgorithmName = "sliding-window".parse()?;
/// assert_eq!(name, AlgorithmName::SlidingWindow);
/// assert!("round-robin".parse::<AlgorithmName>().is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AlgorithmName {
    /// `gcra`
    Gcra,
    /// `token-bucket` (decides as `gcra`)
    TokenBucket,
    /// `leaky-bucket` (decides as `gcra` with `B = C`)
    LeakyBucket,
    /// `leaky-queue`
    LeakyQueue,
    /// `fixed-window`
    FixedWindow,
    /// `sliding-window`
    SlidingWindow,
    /// `sliding-log`
    SlidingLog,
}

impl AlgorithmName {
    /// Every algorithm, in the order of the decision rules.
    ///
    /// # Examples
    /// ```
    /// use tollgate::AlgorithmName;
    /// // What `--compare` runs.
    /// let names: Vec<&str> = AlgorithmName::ALL.iter().map(|a| a.as_str()).collect();
    /// assert_eq!(names[0], "gcra");
    /// assert_eq!(names.len(), 7);
    /// ```
    pub const ALL: [AlgorithmName; 7] = [
        AlgorithmName::Gcra,
        AlgorithmName::TokenBucket,
        AlgorithmName::LeakyBucket,
        AlgorithmName::LeakyQueue,
        AlgorithmName::FixedWindow,
        AlgorithmName::SlidingWindow,
        AlgorithmName::SlidingLog,
    ];

    /// The name, as `tollgate replay --algorithm` takes it.
    ///
    /// # Examples
    /// ```
    /// use tollgate::AlgorithmName;
    /// assert_eq!(AlgorithmName::LeakyQueue.as_str(), "leaky-queue");
    /// assert_eq!(AlgorithmName::LeakyQueue.as_str().parse(), Ok(AlgorithmName::LeakyQueue));
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            AlgorithmName::Gcra => "gcra",
            AlgorithmName::TokenBucket => "token-bucket",
            AlgorithmName::LeakyBucket => "leaky-bucket",
            AlgorithmName::LeakyQueue => "leaky-queue",
            AlgorithmName::FixedWindow => "fixed-window",
            AlgorithmName::SlidingWindow => "sliding-window",
            AlgorithmName::SlidingLog => "sliding-log",
        }
    }

    /// Whether the algorithm takes a burst / capacity.
    ///
    /// # Examples
    /// ```
    /// use tollgate::AlgorithmName;
    /// // Whether `--burst` means anything: window algorithms refuse one.
    /// assert!(AlgorithmName::Gcra.has_burst());
    /// assert!(!AlgorithmName::FixedWindow.has_burst());
    /// ```
    pub fn has_burst(self) -> bool {
        matches!(
            self,
            AlgorithmName::Gcra
                | AlgorithmName::TokenBucket
                | AlgorithmName::LeakyBucket
                | AlgorithmName::LeakyQueue
        )
    }
}

impl fmt::Display for AlgorithmName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AlgorithmName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        AlgorithmName::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| {
                let names: Vec<_> = AlgorithmName::ALL.iter().map(|a| a.as_str()).collect();
                format!(
                    "unknown algorithm '{s}' (expected one of: {})",
                    names.join(", ")
                )
            })
    }
}
