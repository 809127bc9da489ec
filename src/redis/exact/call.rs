//! How a limiter talks to Redis: one script call per Cluster slot (split at `max_batch`),
//! within the timeout, reloading a lost script, and the replies checked against the scripts'
//! contract.

use super::*;

impl<C: RedisConnection> RedisLimiter<C> {
    pub(super) fn timed_out(&self) -> TierError {
        tracing::debug!(timeout = ?self.timeout, "redis call timed out");
        TierError::Timeout {
            timeout: self.timeout,
        }
    }

    pub(super) fn failure(&self, error: redis::RedisError) -> TierError {
        // The connection's own response timeout (set to ours by `connect`) may fire first.
        if error.is_timeout() {
            return self.timed_out();
        }
        // A redirect reaches a plain connection only from a Cluster node, and the node will
        // redirect every call for that slot: a configuration to fix, not an outage to wait
        // out. (A Cluster client follows redirects itself.)
        if !C::CLUSTERED
            && matches!(
                error.kind(),
                ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask)
            )
        {
            tracing::warn!(%error, "a Redis Cluster node answered a plain connection");
            return TierError::Server {
                source: redis::RedisError::from((
                    ErrorKind::InvalidClientConfig,
                    "a Redis Cluster node redirected the call (MOVED/ASK): connect with \
                     connect_cluster or connect_cluster_lazy, not connect",
                    error.to_string(),
                )),
            };
        }
        let error = TierError::from(error);
        tracing::debug!(%error, "redis call failed");
        error
    }

    pub(super) fn item(&self, key: &[u8], cost: u64, at: Option<u64>) -> Item {
        Item {
            key: self.redis_key(key),
            cost,
            at,
        }
    }

    pub(super) async fn one(
        &self,
        key: &[u8],
        cost: u64,
        at: Option<u64>,
        commit: bool,
    ) -> Result<Decision, TierError> {
        let item = self.item(key, cost, at);
        if commit {
            self.coalesced(item).await
        } else {
            self.decide_one(item, false).await
        }
    }

    /// `item` alone in one call.
    pub(super) async fn decide_one(&self, item: Item, commit: bool) -> Result<Decision, TierError> {
        self.call_items(std::slice::from_ref(&item), commit, true)
            .await
            .pop()
            .unwrap_or_else(|| Err(TierError::bad_reply("no result for the check".into())))
    }

    /// Decides `items` in order; one result per item. `reload`: as for [`Self::invoke`].
    pub(super) async fn call_items(
        &self,
        items: &[Item],
        commit: bool,
        reload: bool,
    ) -> Vec<Result<Decision, TierError>> {
        let capacity = self.rule.capacity();
        let results: Vec<Option<Result<Decision, TierError>>> = items
            .iter()
            .map(|item| {
                (item.cost > capacity).then_some(Err(TierError::Capacity {
                    cost: item.cost,
                    capacity,
                }))
            })
            .collect();
        let pending: Vec<usize> = (0..items.len()).filter(|&i| results[i].is_none()).collect();
        let calls = self.plan_calls(&pending, |i| &items[i].key);
        let replies = join_all(
            calls
                .iter()
                .map(|chunk| self.call(items, chunk, commit, reload))
                .collect(),
        )
        .await;
        scatter(results, &calls, replies)
    }

    /// The script calls for the items at `indices`: one group per Cluster slot (the whole list on
    /// a single server), each split into calls of at most `max_batch` items. Items of one key
    /// stay in one call sequence, in order; groups are independent (keys are).
    pub(crate) fn plan_calls<'a>(
        &self,
        indices: &[usize],
        key_of: impl Fn(usize) -> &'a [u8],
    ) -> Vec<Vec<usize>> {
        let groups: Vec<Vec<usize>> = if C::CLUSTERED {
            let mut by_slot: Vec<(Slot, Vec<usize>)> = Vec::new();
            for &i in indices {
                let slot = Slot::for_key(key_of(i));
                match by_slot.iter_mut().find(|(s, _)| *s == slot) {
                    Some((_, group)) => group.push(i),
                    None => by_slot.push((slot, vec![i])),
                }
            }
            by_slot.into_iter().map(|(_, group)| group).collect()
        } else {
            vec![indices.to_vec()]
        };
        groups
            .iter()
            .flat_map(|group| group.chunks(self.max_batch).map(<[usize]>::to_vec))
            .collect()
    }

    /// Sends one script call on the shared connection, within the timeout. When the server
    /// lost the script (`NOSCRIPT`), `reload` sends the call again as `EVAL`, which loads it
    /// on the node of the call's slot alone (a Cluster node that does not answer does not
    /// matter to it); otherwise the call fails with that error ([`TierError::is_no_script`]).
    pub(crate) async fn invoke(&self, call: &ScriptCall, reload: bool) -> Result<Value, TierError> {
        let mut conn = self.conn.get();
        let run = async {
            match call.evalsha().query_async(&mut conn).await {
                Err(e) if reload && e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    call.eval().query_async(&mut conn).await
                }
                reply => reply,
            }
        };
        match tokio::time::timeout(self.timeout, run).await {
            Err(_) => Err(self.timed_out()),
            Ok(Err(error)) => Err(self.failure(error)),
            Ok(Ok(reply)) => Ok(reply),
        }
    }

    /// One script call for the items at `chunk` (all in one slot).
    pub(super) async fn call(
        &self,
        items: &[Item],
        chunk: &[usize],
        commit: bool,
        reload: bool,
    ) -> Result<Vec<Result<Decision, TierError>>, TierError> {
        let rule = self.rule;
        let mut invocation = ScriptCall::new(rule.script());
        let injected = chunk.iter().any(|&i| items[i].at.is_some());
        let [first, second] = rule.script_params();
        invocation
            .arg(if injected { INJECTED_MIN_TTL_MS } else { 0 })
            .arg(if commit { "1" } else { "0" })
            .arg(first)
            .arg(second);
        for &i in chunk {
            let item = &items[i];
            invocation.key(&item.key[..]).arg(item.cost);
            match item.at {
                Some(at) => invocation.arg(at),
                None => invocation.arg(""),
            };
        }
        let reply = self.invoke(&invocation, reload).await?;
        let rows = rows(reply, chunk.len())?;
        Ok(chunk
            .iter()
            .zip(rows)
            .map(|(&i, row)| {
                let item = &items[i];
                ours(rule, &row, &item.key)?;
                rule.decision(item.cost, &row, clock_unit(item.at.is_some()))
            })
            .collect())
    }
}

/// Refuses a reply row that says `key` holds what our scripts did not write (logged: an
/// operator must look), or that is not a row of `rule`'s script.
pub(super) fn ours(rule: RedisRule, row: &[i64], key: &[u8]) -> Result<(), TierError> {
    let key = || String::from_utf8_lossy(key).into_owned();
    match rule.verdict(row)? {
        Verdict::WrongType => {
            tracing::warn!(key = %key(), "rate-limit key holds another Redis type");
            Err(TierError::WrongType { key: key() })
        }
        Verdict::CorruptState => {
            tracing::warn!(key = %key(), "rate-limit key holds a foreign value");
            Err(TierError::CorruptState { key: key() })
        }
        Verdict::Decided { .. } => Ok(()),
    }
}

/// The unit of the times in a reply: 1 ns for an injected time, 1 µs for the server's `TIME`.
pub(super) fn clock_unit(injected: bool) -> u64 {
    if injected {
        1
    } else {
        1000
    }
}

/// A script's reply as `n` rows of integers; anything else is [`TierError::BadReply`].
pub(super) fn rows(reply: Value, n: usize) -> Result<Vec<Vec<i64>>, TierError> {
    let Value::Array(items) = reply else {
        return Err(TierError::bad_reply(format!(
            "expected an array, got {reply:?}"
        )));
    };
    if items.len() != n {
        return Err(TierError::bad_reply(format!(
            "{} results for {n} checks",
            items.len()
        )));
    }
    items
        .into_iter()
        .map(|item| match item {
            Value::Array(fields) => fields
                .into_iter()
                .map(|field| match field {
                    Value::Int(v) => Ok(v),
                    other => Err(TierError::bad_reply(format!(
                        "expected an integer, got {other:?}"
                    ))),
                })
                .collect(),
            other => Err(TierError::bad_reply(format!(
                "expected an array, got {other:?}"
            ))),
        })
        .collect()
}

/// Spreads the replies of script calls over their items: the result of item `i` of each call
/// goes to `results[i]` (a failed call fails each of its items); an item left without a result
/// is a [`TierError::BadReply`].
pub(crate) fn scatter<T>(
    mut results: Vec<Option<Result<T, TierError>>>,
    calls: &[Vec<usize>],
    replies: Vec<Result<Vec<Result<T, TierError>>, TierError>>,
) -> Vec<Result<T, TierError>> {
    for (chunk, reply) in calls.iter().zip(replies) {
        match reply {
            Ok(decided) => {
                for (&i, result) in chunk.iter().zip(decided) {
                    results[i] = Some(result);
                }
            }
            Err(error) => {
                for &i in chunk {
                    results[i] = Some(Err(error.clone()));
                }
            }
        }
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(TierError::bad_reply("an item got no result".into()))))
        .collect()
}

/// Runs `futures` concurrently on the current task; their outputs in order.
pub(crate) async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            // A finished future is never polled again.
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}
