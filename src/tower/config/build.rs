//! Building the layer from a configuration: each policy's backend (in-process limiters on the
//! clock given, or Redis), quotas, keys, methods and fallbacks, checked as it goes.

use super::*;

impl LayerConfig {
    /// The layer, with in-process limiters on the precise default clock.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the policy and what its algorithm refused (a window algorithm's
    /// window under 1 ms, a burst on a window algorithm, a limit too large, …).
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::config::LayerConfig;
    /// let config: LayerConfig = toml::from_str(r#"
    ///     [[policy]]
    ///     name = "api"
    ///     algorithm = "fixed-window"
    ///     quota = "10/1s burst 20"
    /// "#)?;
    /// // A window algorithm takes no burst.
    /// assert!(config.build().unwrap_err().to_string().contains("\"api\""));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn build(self) -> Result<RateLimitLayer, ConfigError> {
        self.builder()?.build()
    }

    /// A builder with every setting of the file, in-process limiters on the precise default
    /// clock: add closures (a computed cost, a custom denial) before building.
    ///
    /// # Errors
    /// As for [`LayerConfig::build`].
    ///
    /// # Examples
    /// ```
    /// use tollgate::tower::config::LayerConfig;
    /// let config: LayerConfig = toml::from_str("[[policy]]\nname = \"api\"\nquota = \"5/1s\"")?;
    /// let layer = config
    ///     .builder()?
    ///     .allow_if(|parts| parts.headers.contains_key("x-internal"))
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder(self) -> Result<RateLimitLayerBuilder, ConfigError> {
        self.builder_with_clock(QuantaClock::default())
    }

    /// As [`LayerConfig::builder`], every in-process limiter reading `clock` (a
    /// [`ManualClock`](crate::clock::ManualClock) in tests).
    ///
    /// # Errors
    /// As for [`LayerConfig::build`], and [`QuotaError::ClockTooCoarse`] (named with its
    /// policy) if the clock cannot serve a quota.
    ///
    /// # Examples
    /// ```
    /// use tollgate::clock::ManualClock;
    /// use tollgate::tower::config::LayerConfig;
    /// let clock = ManualClock::new();
    /// let config: LayerConfig = toml::from_str("[[policy]]\nname = \"api\"\nquota = \"5/1s\"")?;
    /// let layer = config.builder_with_clock(clock.clone())?.build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder_with_clock<C>(self, clock: C) -> Result<RateLimitLayerBuilder, ConfigError>
    where
        C: Clock + Clone + 'static,
    {
        self.builder_with(|policy| policy.in_process(clock.clone()))
    }

    /// A builder whose policies check the backends `backend` makes from their configuration:
    /// for example a Redis limiter for some policies and an in-process one
    /// ([`PolicyConfig::in_process`]) for the others.
    ///
    /// # Errors
    /// The first error `backend` returns, else as for [`LayerConfig::build`].
    ///
    /// # Examples
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::clock::QuantaClock;
    /// use tollgate::tower::config::LayerConfig;
    /// let config: LayerConfig = toml::from_str("[[policy]]\nname = \"api\"\nquota = \"5/1s\"")?;
    /// let layer = config
    ///     .builder_with(|policy| {
    ///         println!("policy {} on {}", policy.name, policy.algorithm);
    ///         policy.in_process(QuantaClock::default())
    ///     })?
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn builder_with(
        self,
        mut backend: impl FnMut(&PolicyConfig) -> Result<Arc<dyn CheckBackend>, ConfigError>,
    ) -> Result<RateLimitLayerBuilder, ConfigError> {
        let mut names = std::collections::HashSet::new();
        for policy in self.policies.iter().chain(&self.default_policy) {
            if !names.insert(policy.name.as_str()) {
                return Err(policy.problem("the name is used by another policy"));
            }
        }
        let mut builder = RateLimitLayer::builder()
            .headers(self.headers)
            .trusted_proxies(self.trusted_proxies)
            .proxy_header(self.proxy_header)
            .ipv6_prefix(self.ipv6_prefix)
            .allow_cidrs(self.allow_cidrs)
            .allow_paths(self.allow_paths);
        if let Some(fallback) = self.on_missing_key {
            builder = builder.on_missing_key(fallback);
        }
        if let Some(fallback) = self.on_error {
            builder = builder.on_error(fallback);
        }
        if let Some(fallback) = self.on_table_full {
            builder = builder.on_table_full(fallback);
        }
        if let Some(bytes) = self.max_key_len {
            builder = builder.max_key_len(bytes);
        }
        if let Some(long_key) = self.on_long_key {
            builder = builder.on_long_key(long_key);
        }
        for config in &self.policies {
            builder = builder.policy(config.build_policy(&mut backend)?);
        }
        if let Some(config) = &self.default_policy {
            builder = builder.default_policy(config.build_policy(&mut backend)?);
        }
        Ok(builder)
    }
}

impl PolicyConfig {
    /// An error about this policy.
    fn problem(&self, problem: &str) -> ConfigError {
        ConfigError::Policy {
            policy: self.name.clone(),
            problem: problem.to_owned(),
        }
    }

    /// The policy over the backends `backend` makes: one, or one per tier.
    fn build_policy(
        &self,
        backend: &mut impl FnMut(&PolicyConfig) -> Result<Arc<dyn CheckBackend>, ConfigError>,
    ) -> Result<Policy, ConfigError> {
        if self.quotas.is_empty() {
            // No rate: an in-flight bound alone, or a policy that limits nothing (refused).
            return match (self.in_flight, self.tiers.is_empty()) {
                (Some(max), true) => self.policy(Policy::in_flight(self.name.clone(), max)),
                (Some(_), false) => Err(self.problem("tiers need a quota of the policy's own")),
                (None, _) => Err(self.problem("no quota, and no `in_flight` bound")),
            };
        }
        if self.tiers.is_empty() {
            return self.policy(Policy::new(self.name.clone(), backend(self)?));
        }
        let mut builder = Tiers::builder(self.tier.clone(), backend(self)?);
        for (name, tier) in &self.tiers {
            let config = PolicyConfig {
                name: format!("{}/{name}", self.name),
                quotas: tier.quotas.clone(),
                tiers: BTreeMap::new(),
                ..self.clone()
            };
            builder = builder.tier(name.clone(), backend(&config)?);
        }
        let tiers = builder
            .build()
            .map_err(|_| self.problem("a tier is named twice"))?;
        for (name, tier) in &self.tiers {
            for key in &tier.keys {
                tiers
                    .assign(Key::from(key.as_str()), name)
                    .map_err(|e| self.problem(&e.to_string()))?;
            }
        }
        self.policy(Policy::new(self.name.clone(), tiers))
    }

    /// `base` (the policy over its backend) with this configuration's matching, key, cost and
    /// mode.
    fn policy(&self, base: Policy) -> Result<Policy, ConfigError> {
        let mut policy = base.key(self.key.clone()).cost(self.cost).mode(self.mode);
        match (&self.path, &self.path_pattern) {
            (Some(_), Some(_)) => {
                return Err(self.problem("set `path` or `path_pattern`, not both"))
            }
            (Some(prefix), None) => policy = policy.path_prefix(prefix.clone()),
            (None, Some(pattern)) => policy = policy.path_pattern(pattern),
            (None, None) => {}
        }
        if let Some(methods) = &self.methods {
            policy = policy.methods(methods.iter().map(|m| m.0.clone()));
        }
        policy = policy.head_as_get(self.head_as_get);
        if let Some(fallback) = self.on_missing_key {
            policy = policy.on_missing_key(fallback);
        }
        if let Some([_total, _per_key]) = self.max_waiters {
            #[cfg(feature = "tokio")]
            {
                policy = policy.max_waiters(_total, _per_key);
            }
            #[cfg(not(feature = "tokio"))]
            return Err(
                self.problem("max_waiters is for delay mode, which needs the `tokio` feature")
            );
        }
        if let Some(max) = self.in_flight {
            policy = policy
                .max_in_flight(max)
                .in_flight_scope(self.in_flight_scope);
        }
        if let Some(code) = self.in_flight_status {
            let status = http::StatusCode::from_u16(code)
                .map_err(|_| self.problem(&format!("in_flight_status {code} is not a status")))?;
            policy = policy.in_flight_status(status);
        }
        if !self.refund.is_empty() {
            let statuses = self.refund.clone();
            policy = policy.refund_when(move |status| statuses.iter().any(|m| m.matches(status)));
        }
        if !self.cost_by_path.is_empty() {
            // Longest prefix first: the first match is the most specific.
            let mut costs: Vec<(PathMatch, usize, u64)> = self
                .cost_by_path
                .iter()
                .map(|(path, &cost)| (PathMatch::Prefix(path.clone()), path.len(), cost))
                .collect();
            costs.sort_by_key(|c| std::cmp::Reverse(c.1));
            let default = self.cost;
            if let Some((path, _)) = self.cost_by_path.iter().find(|(p, _)| !p.starts_with('/')) {
                return Err(self.problem(&format!("cost_by_path {path:?} must start with `/`")));
            }
            policy = policy.cost_fn(move |parts| {
                let path = crate::tower::client_path(parts);
                costs
                    .iter()
                    .find(|(prefix, _, _)| prefix.matches(&path))
                    .map_or(default, |&(_, _, cost)| cost)
            });
        }
        Ok(policy)
    }

    /// This policy's limiter in process, reading `clock`: a [`KeyedLimiter`] for one quota, a
    /// [`MultiLimiter`] for several, of the configured algorithm.
    ///
    /// # Errors
    /// [`ConfigError::Quota`] if the algorithm refuses a quota or the clock.
    ///
    /// # Examples
    /// ```
    /// use tollgate::clock::QuantaClock;
    /// use tollgate::tower::config::PolicyConfig;
    /// let policy: PolicyConfig = toml::from_str("name = \"api\"\nquota = \"5/1s\"")?;
    /// let backend = policy.in_process(QuantaClock::default())?;
    /// assert_eq!(backend.quota(0).map(|q| q.limit), Some(5));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn in_process<C>(&self, clock: C) -> Result<Arc<dyn CheckBackend>, ConfigError>
    where
        C: Clock + Clone + 'static,
    {
        match self.algorithm {
            AlgorithmName::Gcra | AlgorithmName::TokenBucket | AlgorithmName::LeakyBucket => {
                self.limiter(Gcra::new, clock)
            }
            AlgorithmName::LeakyQueue => self.limiter(LeakyQueue::new, clock),
            AlgorithmName::FixedWindow => self.limiter(FixedWindow::new, clock),
            AlgorithmName::SlidingWindow => self.limiter(SlidingWindow::new, clock),
            AlgorithmName::SlidingLog => self.limiter(SlidingLog::new, clock),
        }
    }

    /// This policy's limit held globally on Redis (feature `redis`): the exact tier
    /// ([`RedisLimiter`](crate::redis::RedisLimiter), or for several quotas a
    /// [`RedisMultiLimiter`](crate::redis::RedisMultiLimiter), all or nothing in one script call)
    /// over `conn`, with the configured algorithm, under the Redis key prefix `tollgate:NAME`
    /// (each policy its own state).
    /// Use it in [`LayerConfig::builder_with`] to make policies global.
    ///
    /// With `on_redis_failure`, the policy is a [`GuardedLimiter`](crate::redis::GuardedLimiter)
    /// over the exact limiter (its background task spawned on the current tokio runtime).
    ///
    /// # Errors
    /// [`ConfigError::Quota`] if the Redis tier refuses the quota;
    /// [`ConfigError::Policy`] for `max_keys` (it bounds in-process limiters only), and for
    /// `on_redis_failure` on several quotas or outside a tokio runtime.
    ///
    /// # Examples
    /// ```no_run
    /// use redis::aio::ConnectionManager;
    /// use tollgate::tower::config::LayerConfig;
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let conn = ConnectionManager::new(redis::Client::open("redis://127.0.0.1:6379")?).await?;
    /// let config: LayerConfig = toml::from_str("[[policy]]\nname = \"api\"\nquota = \"5/1s\"")?;
    /// let layer = config.builder_with(|policy| policy.redis(conn.clone()))?.build()?;
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "redis")]
    pub fn redis<Conn: crate::redis::RedisConnection>(
        &self,
        conn: Conn,
    ) -> Result<Arc<dyn CheckBackend>, ConfigError> {
        if self.max_keys.is_some() {
            return Err(self.problem("`max_keys` bounds in-process limiters only"));
        }
        let rules = self
            .quotas
            .iter()
            .map(|&quota| crate::redis::RedisRule::for_algorithm(self.algorithm, quota))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| ConfigError::Quota {
                policy: self.name.clone(),
                error,
            })?;
        let Some((&first, more)) = rules.split_first() else {
            return Err(self.problem("no quota"));
        };
        let limiter = crate::redis::RedisLimiter::builder(first)
            .prefix(format!("tollgate:{}", self.name))
            .build(conn);
        if let Some(failure) = self.on_redis_failure {
            use crate::redis::{FailureHandling, FailurePolicy};
            if !more.is_empty() {
                return Err(self.problem("`on_redis_failure` guards single-quota policies only"));
            }
            let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                return Err(self.problem(
                    "`on_redis_failure` needs the configuration built inside a tokio runtime",
                ));
            };
            let policy = match failure {
                RedisFailure::FailOpen => FailurePolicy::FailOpen,
                RedisFailure::FailClosed => FailurePolicy::FailClosed,
                RedisFailure::Local => FailurePolicy::Local,
            };
            let guarded = limiter.guarded_on(FailureHandling::new(policy), &runtime);
            return Ok(Arc::new(crate::tower::RedisBackend::new(guarded)));
        }
        if more.is_empty() {
            return Ok(Arc::new(crate::tower::RedisBackend::new(limiter)));
        }
        // One algorithm for every rule: `with_rules` cannot refuse them.
        let all = limiter
            .with_rules(more.iter().copied())
            .map_err(|error| self.problem(&error.to_string()))?;
        Ok(Arc::new(crate::tower::RedisBackend::all_of(all)))
    }

    fn limiter<A, C>(
        &self,
        rule: impl Fn(Quota) -> Result<A, QuotaError>,
        clock: C,
    ) -> Result<Arc<dyn CheckBackend>, ConfigError>
    where
        A: Algorithm,
        C: Clock + Clone + 'static,
    {
        let quota_error = |error| ConfigError::Quota {
            policy: self.name.clone(),
            error,
        };
        let rules = self
            .quotas
            .iter()
            .map(|&q| rule(q))
            .collect::<Result<Vec<A>, _>>()
            .map_err(quota_error)?;
        let limiter = |rule: A| {
            let mut builder = KeyedLimiter::<Key, A>::builder(rule).clock(clock.clone());
            if let Some(max) = self.max_keys {
                let overflow = match self.overflow {
                    Overflow::Shared => OverflowPolicy::Shared,
                    Overflow::Deny => OverflowPolicy::Deny,
                };
                builder = builder.max_keys(max, overflow);
            }
            builder.build().map_err(quota_error)
        };
        match rules.as_slice() {
            [] => Err(self.problem("no quota")),
            [rule] => Ok(Arc::new(limiter(*rule)?)),
            _ => {
                let limits = rules.into_iter().map(limiter);
                Ok(Arc::new(MultiLimiter::from_limits(
                    limits.collect::<Result<Vec<_>, _>>()?,
                )))
            }
        }
    }
}
