//! A breaker per Cluster slot owner: one master failing over sends only the keys of its own
//! slots to the failure policy, while the keys of the other masters stay global.
//!
//! The slot map is read from `CLUSTER SLOTS` by the guarded limiter's background task: at
//! start, when a breaker opens or closes, while one is open (its master may be failing over),
//! or when a call meets a topology error (`MOVED`, `ASK`, `CLUSTERDOWN`, a node the client
//! lost), at most every [`Owners::MIN_REFRESH`], and every [`Owners::MAX_AGE`] anyway. When the
//! slots of a master whose breaker is open move to another, the failover is followed: the
//! Cluster client refreshes its own slots only on a redirect or a dropped connection, so the
//! limiter replaces its connection with a new one once that answers (see `follow_failover`). Each master is named by its node id (its address if the
//! reply has none); a breaker follows its master's name from one map to the next, so a map
//! that did not move keeps every breaker where it was. Until a map is read, and for a slot
//! that no master serves, keys share the breaker of the unknown owner.
//!
//! The breakers are `Breaker`s as they are (`breaker.rs`, loom-modelled): each owner has its
//! own, and nothing is shared between them but the map, which is replaced whole under a lock.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::cluster_routing::Slot;
use redis::Value;

use super::breaker::{Breaker, Phase, Settings};

/// One range of a `CLUSTER SLOTS` reply: its first and last slot, and its master's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Range {
    pub first: u16,
    pub last: u16,
    pub master: Box<str>,
}

/// The ranges of a `CLUSTER SLOTS` reply (RESP2 or RESP3): each is `[first, last, master,
/// replicas…]`, a node `[host, port, id, …]`. The master is named by its id, or `host:port`
/// when the reply has no id (before Redis 4).
pub(super) fn parse_slots(reply: &Value) -> Result<Vec<Range>, String> {
    let Value::Array(ranges) = reply else {
        return Err(format!("CLUSTER SLOTS: expected an array, got {reply:?}"));
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    };
    let slot = |v: &Value| match v {
        Value::Int(n) => u16::try_from(*n).ok().filter(|&n| Slot::new(n).is_some()),
        _ => None,
    };
    let mut out = Vec::with_capacity(ranges.len());
    for range in ranges {
        let bad = || format!("CLUSTER SLOTS: malformed range {range:?}");
        let Value::Array(items) = range else {
            return Err(bad());
        };
        let (Some(first), Some(last), Some(Value::Array(master))) = (
            items.first().and_then(slot),
            items.get(1).and_then(slot),
            items.get(2),
        ) else {
            return Err(bad());
        };
        if first > last {
            return Err(bad());
        }
        let id = master.get(2).and_then(text).filter(|id| !id.is_empty());
        let name = match id {
            Some(id) => id,
            None => match (master.first().and_then(text), master.get(1)) {
                (Some(host), Some(Value::Int(port))) => format!("{host}:{port}"),
                _ => return Err(bad()),
            },
        };
        out.push(Range {
            first,
            last,
            master: name.into(),
        });
    }
    out.sort_by_key(|r| r.first);
    Ok(out)
}

/// The slot of `key`'s state (`state_key(key)`, whose hash tag is the key, escaped): the key's
/// own slot when escaping leaves it as it is, without building the state key.
pub(super) fn key_slot(key: &[u8], state_key: impl FnOnce(&[u8]) -> Vec<u8>) -> Slot {
    if !key.is_empty() && !key.iter().any(|b| matches!(b, b'{' | b'}' | b'%')) {
        // No brace: the whole key is hashed, as the tag `{key}` of its state key is.
        Slot::for_key(key)
    } else {
        Slot::for_key(state_key(key))
    }
}

/// One master (or the unknown owner): its breaker, and a user key whose state lives on one of
/// its slots, which its probes write next to.
pub(super) struct Owner {
    pub name: Box<str>,
    pub breaker: Arc<Breaker>,
    /// `None` for the unknown owner, whose probe writes next to the last key that failed.
    pub probe: Option<Box<[u8]>>,
}

/// A slot map: the owners and which serves each slot.
pub(super) struct Map {
    /// Index 0 is the unknown owner.
    pub owners: Vec<Owner>,
    slots: HashMap<Slot, u16>,
    ranges: Vec<Range>,
}

/// The name of the owner of keys whose master is not known.
const UNKNOWN: &str = "?";

impl Map {
    /// No map read yet: every key on the unknown owner.
    fn unknown(settings: Settings) -> Map {
        Map {
            owners: vec![Owner {
                name: UNKNOWN.into(),
                breaker: Arc::new(Breaker::new(settings)),
                probe: None,
            }],
            slots: HashMap::new(),
            ranges: Vec::new(),
        }
    }

    /// The owner of `slot`.
    pub fn owner_of(&self, slot: Slot) -> &Owner {
        let index = self.slots.get(&slot).copied().unwrap_or(0);
        &self.owners[usize::from(index)]
    }

    /// The map `ranges` give, keeping the breakers of the owners this one knows (by name);
    /// `state_key` names a user key's state (to find each owner a probe key).
    fn remap(
        &self,
        ranges: Vec<Range>,
        state_key: impl Fn(&[u8]) -> Vec<u8>,
        settings: Settings,
    ) -> Map {
        let mut owners = vec![Owner {
            name: UNKNOWN.into(),
            breaker: Arc::clone(&self.owners[0].breaker),
            probe: None,
        }];
        let mut slots = HashMap::with_capacity(16_384);
        for range in &ranges {
            let index = match owners.iter().position(|o| o.name == range.master) {
                Some(index) => index,
                None => {
                    let breaker = self
                        .owners
                        .iter()
                        .find(|o| o.name == range.master)
                        .map_or_else(
                            || Arc::new(Breaker::new(settings)),
                            |o| Arc::clone(&o.breaker),
                        );
                    owners.push(Owner {
                        name: range.master.clone(),
                        breaker,
                        probe: None,
                    });
                    owners.len() - 1
                }
            };
            let Ok(index) = u16::try_from(index) else {
                continue; // more masters than slots: cannot be
            };
            for slot in range.first..=range.last {
                if let Some(slot) = Slot::new(slot) {
                    slots.insert(slot, index);
                }
            }
        }
        // A probe key per owner: the first `probe-<n>` whose state lies on one of its slots
        // (an owner of s slots is met after 16384 / s keys on average).
        let mut missing = owners.len() - 1;
        let mut n = 0u32;
        while missing > 0 && n < 1 << 20 {
            let key = format!("probe-{n}");
            n += 1;
            let index = slots.get(&Slot::for_key(state_key(key.as_bytes())));
            if let Some(owner) = index.and_then(|&i| owners.get_mut(usize::from(i))) {
                if owner.probe.is_none() {
                    owner.probe = Some(key.into_bytes().into());
                    missing -= 1;
                }
            }
        }
        Map {
            owners,
            slots,
            ranges,
        }
    }

    /// Whether any owner's breaker is open or half-open (the policy decides some keys).
    pub fn any_open(&self) -> bool {
        self.owners.iter().any(|o| o.breaker.is_open())
    }

    /// Whether any master's breaker is closed (the unknown owner's counts only while no map
    /// is known: once one is, it serves no master's slots).
    pub fn any_closed(&self) -> bool {
        let serving = if self.slots.is_empty() {
            &self.owners[..1]
        } else {
            &self.owners[1..]
        };
        serving.iter().any(|o| !o.breaker.is_open())
    }
}

/// The least recovered of `phases`: open if any is, else half-open if any is, else closed.
pub(super) fn least_recovered(phases: impl IntoIterator<Item = Phase>) -> Phase {
    let mut least = Phase::Closed;
    for phase in phases {
        match (phase, least) {
            (Phase::Open, _) => return Phase::Open,
            (Phase::HalfOpen { .. }, Phase::Closed) => least = phase,
            _ => {}
        }
    }
    least
}

/// The breakers of a guarded limiter on a Cluster, one per slot owner.
pub(super) struct Owners {
    map: parking_lot::RwLock<Arc<Map>>,
    settings: Settings,
    /// A refresh was asked for (at start, on a transition or a topology error).
    stale: AtomicBool,
    /// When the map was last asked of the Cluster.
    asked: parking_lot::Mutex<Option<Instant>>,
    /// A failover was seen and the connection not replaced since: the probe key of a master
    /// that took slots over, for the new connection to answer first.
    failed_over: parking_lot::Mutex<Option<Option<Box<[u8]>>>>,
}

impl Owners {
    /// The least time between two reads of the slot map.
    pub const MIN_REFRESH: Duration = Duration::from_secs(2);
    /// The map is read again after this long even if nothing asked for it.
    pub const MAX_AGE: Duration = Duration::from_secs(30);

    pub fn new(settings: Settings) -> Owners {
        Owners {
            map: parking_lot::RwLock::new(Arc::new(Map::unknown(settings))),
            settings,
            stale: AtomicBool::new(true),
            asked: parking_lot::Mutex::new(None),
            failed_over: parking_lot::Mutex::new(None),
        }
    }

    /// Whether a failover wants the connection replaced, and the key to probe it on.
    pub fn failed_over(&self) -> Option<Option<Box<[u8]>>> {
        self.failed_over.lock().clone()
    }

    /// The connection was replaced after a failover.
    pub fn replaced(&self) {
        *self.failed_over.lock() = None;
    }

    /// The current map.
    pub fn map(&self) -> Arc<Map> {
        Arc::clone(&self.map.read())
    }

    /// The breaker of `slot`'s owner.
    pub fn breaker_of(&self, slot: Slot) -> Arc<Breaker> {
        Arc::clone(&self.map.read().owner_of(slot).breaker)
    }

    /// The map may have changed: read it again when next allowed.
    pub fn ask_refresh(&self) {
        // Relaxed: a hint that publishes nothing (the map is behind its lock).
        self.stale.store(true, Ordering::Relaxed);
    }

    /// Whether to read the map now; if so, the read counts as asked from now.
    pub fn due(&self, now: Instant) -> bool {
        let mut asked = self.asked.lock();
        let due = match *asked {
            None => true,
            Some(at) => {
                let since = now.saturating_duration_since(at);
                // Relaxed: see `ask_refresh`.
                (self.stale.load(Ordering::Relaxed) && since >= Self::MIN_REFRESH)
                    || since >= Self::MAX_AGE
            }
        };
        if due {
            *asked = Some(now);
            // Relaxed: see `ask_refresh`; a request made while the read is out is met by it.
            self.stale.store(false, Ordering::Relaxed);
        }
        due
    }

    /// Installs the map `ranges` give, unless it is the one in force.
    pub fn install(&self, ranges: Vec<Range>, state_key: impl Fn(&[u8]) -> Vec<u8>) -> Installed {
        let current = self.map();
        if current.ranges == ranges {
            return Installed::default();
        }
        // Slots of a master whose breaker is open now served by another: a failover.
        let moved = ranges.iter().find_map(|range| {
            let slot = Slot::new(range.first)?;
            let was = current.owner_of(slot);
            (&*was.name != UNKNOWN && was.name != range.master && was.breaker.is_open())
                .then_some(slot)
        });
        let next = Arc::new(current.remap(ranges, state_key, self.settings));
        if let Some(slot) = moved {
            *self.failed_over.lock() = Some(next.owner_of(slot).probe.clone());
        }
        *self.map.write() = next;
        Installed {
            changed: true,
            failed_over: moved.is_some(),
        }
    }
}

/// What installing a map did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Installed {
    /// The map differs from the one before.
    pub changed: bool,
    /// Slots of a master whose breaker was open are served by another master now.
    pub failed_over: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            threshold: 1,
            open_after: 0,
            window: 1_000_000_000,
            rate_ppm: 500_000,
            min_failures: 1,
            half_open_successes: 1,
        }
    }

    fn node(host: &str, port: i64, id: &str) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(id.as_bytes().to_vec()),
            Value::Array(vec![]),
        ])
    }

    /// `CLUSTER SLOTS` as `redis-server` 7.0.15 answered it (RESP2, raw) on a Cluster made
    /// by `redis-cli --cluster create` of three masters on 127.0.0.1:31001-31003.
    const RECORDED: &[u8] =
        b"*3\r\n*3\r\n:0\r\n:5460\r\n*4\r\n$9\r\n127.0.0.1\r\n:31001\r\n$40\r\n\
        1f0475fe617b85ce07fd73cd0796a67b64ccde17\r\n*0\r\n*3\r\n:5461\r\n:10922\r\n*4\r\n$9\r\n\
        127.0.0.1\r\n:31002\r\n$40\r\nd8d572d867dacb469d07bd0741987ac3d297c260\r\n*0\r\n*3\r\n\
        :10923\r\n:16383\r\n*4\r\n$9\r\n127.0.0.1\r\n:31003\r\n$40\r\n\
        52e26f22f100b35f7cf351270b9e922cc9e53685\r\n*0\r\n";

    const FIRST: &str = "1f0475fe617b85ce07fd73cd0796a67b64ccde17";
    const THIRD: &str = "52e26f22f100b35f7cf351270b9e922cc9e53685";

    fn recorded() -> Value {
        redis::parse_redis_value(RECORDED).expect("a RESP reply")
    }

    fn state_key(key: &[u8]) -> Vec<u8> {
        crate::redis::exact::state_key(b"tollgate", "gcra", key)
    }

    #[test]
    fn a_recorded_reply_maps_every_slot_to_its_master() {
        let ranges = parse_slots(&recorded()).unwrap();
        assert_eq!(ranges.len(), 3);
        assert_eq!(
            (ranges[0].first, ranges[0].last, &*ranges[0].master),
            (0, 5460, FIRST)
        );
        assert_eq!((ranges[2].first, ranges[2].last), (10923, 16383));
        let owners = Owners::new(settings());
        assert!(owners.install(ranges.clone(), state_key).changed);
        assert!(
            !owners.install(ranges, state_key).changed,
            "the same map again"
        );
        let map = owners.map();
        assert_eq!(map.owners.len(), 4, "three masters and the unknown owner");
        // `foo` hashes to slot 12182, `bar` to 5061 (CLUSTER KEYSLOT).
        assert_eq!(&*map.owner_of(Slot::for_key("foo")).name, THIRD);
        assert_eq!(&*map.owner_of(Slot::for_key("bar")).name, FIRST);
        for slot in [0, 5460, 5461, 10922, 10923, 16383] {
            assert_ne!(&*map.owner_of(Slot::new(slot).unwrap()).name, UNKNOWN);
        }
        // Each master's probe key lies on one of its own slots.
        for owner in &map.owners[1..] {
            let probe = owner.probe.as_deref().expect("a probe key");
            let slot = Slot::for_key(state_key(probe));
            assert_eq!(map.owner_of(slot).name, owner.name);
        }
    }

    #[test]
    fn a_reply_without_ids_names_masters_by_address_and_bad_replies_are_errors() {
        let range = Value::Array(vec![
            Value::Int(0),
            Value::Int(16383),
            Value::Array(vec![
                Value::BulkString(b"10.0.0.1".to_vec()),
                Value::Int(6379),
            ]),
        ]);
        let ranges = parse_slots(&Value::Array(vec![range])).unwrap();
        assert_eq!(&*ranges[0].master, "10.0.0.1:6379");
        for bad in [
            Value::Nil,
            Value::Array(vec![Value::Int(3)]),
            Value::Array(vec![Value::Array(vec![
                Value::Int(5),
                Value::Int(4),
                node("h", 1, "x"),
            ])]),
            Value::Array(vec![Value::Array(vec![
                Value::Int(0),
                Value::Int(16384),
                node("h", 1, "x"),
            ])]),
        ] {
            assert!(parse_slots(&bad).is_err(), "{bad:?}");
        }
    }

    /// Keys of an open master's slots are that master's alone; a new map keeps the breakers
    /// of the masters it still names, and the modes aggregate as the limiter reports them.
    #[test]
    fn breakers_follow_their_master_and_aggregate() {
        let owners = Owners::new(settings());
        owners.install(parse_slots(&recorded()).unwrap(), state_key);
        let foo = owners.breaker_of(Slot::for_key("foo"));
        let bar = owners.breaker_of(Slot::for_key("bar"));
        assert!(!Arc::ptr_eq(&foo, &bar));
        assert!(foo.failed(1), "threshold 1: the first failure opens it");
        let map = owners.map();
        assert!(map.any_open() && map.any_closed());
        assert!(!bar.is_open(), "another master's keys stay global");
        for owner in &map.owners[1..] {
            owner.breaker.force_open();
        }
        assert!(
            !map.any_closed(),
            "every master open; the unknown owner serves none"
        );
        assert!(!map.owners[0].breaker.is_open());
        for owner in &map.owners[1..] {
            while !owner.breaker.probe_answered(2) {}
        }
        assert!(foo.failed(1));
        let phases = map.owners.iter().map(|o| o.breaker.phase());
        assert_eq!(least_recovered(phases), Phase::Open);
        // The masters move: 0-5460's master is replaced, the others keep their breakers.
        let mut moved = parse_slots(&recorded()).unwrap();
        moved[0].master = "d00d".into();
        let installed = owners.install(moved.clone(), state_key);
        assert!(
            installed.changed && !installed.failed_over,
            "bar's master was closed"
        );
        assert!(owners.breaker_of(Slot::for_key("foo")).is_open(), "kept");
        assert!(
            !Arc::ptr_eq(&owners.breaker_of(Slot::for_key("bar")), &bar),
            "a new master"
        );
        // Then foo's slots move away from its open breaker: a failover, to a closed breaker.
        moved[2].master = "f00d".into();
        let installed = owners.install(moved, state_key);
        assert!(installed.changed && installed.failed_over);
        assert!(!owners.breaker_of(Slot::for_key("foo")).is_open());
        // The new connection is to answer first on the master that took the slots over.
        let at = owners
            .failed_over()
            .expect("a failover to follow")
            .expect("a probe key");
        assert_eq!(
            &*owners.map().owner_of(Slot::for_key(state_key(&at))).name,
            "f00d"
        );
        owners.replaced();
        assert!(owners.failed_over().is_none());
        assert!(foo.probe_answered(2), "one half-open success closes it");
        let phases = owners
            .map()
            .owners
            .iter()
            .map(|o| o.breaker.phase())
            .collect::<Vec<_>>();
        assert_eq!(least_recovered(phases), Phase::Closed);
        assert_eq!(
            least_recovered([
                Phase::Closed,
                Phase::HalfOpen { answered: 1 },
                Phase::Closed
            ]),
            Phase::HalfOpen { answered: 1 }
        );
        assert_eq!(
            least_recovered([Phase::HalfOpen { answered: 1 }, Phase::Open]),
            Phase::Open
        );
    }

    #[test]
    fn a_keys_slot_is_its_state_keys() {
        for key in ["alice", "", "a}b", "a{b}c", "100%", "{x}", "user:42", "é"] {
            assert_eq!(
                key_slot(key.as_bytes(), state_key),
                Slot::for_key(state_key(key.as_bytes())),
                "{key:?}"
            );
        }
        for n in 0..2_000 {
            let key = format!("k{n}");
            assert_eq!(
                key_slot(key.as_bytes(), state_key),
                Slot::for_key(state_key(key.as_bytes()))
            );
        }
    }

    #[test]
    fn the_map_is_read_at_start_when_asked_at_most_every_two_seconds_and_when_old() {
        let owners = Owners::new(settings());
        let t0 = Instant::now();
        assert!(owners.due(t0), "at start");
        assert!(!owners.due(t0 + Duration::from_secs(1)));
        owners.ask_refresh();
        assert!(!owners.due(t0 + Duration::from_secs(1)), "too soon");
        assert!(owners.due(t0 + Owners::MIN_REFRESH));
        assert!(!owners.due(t0 + Duration::from_secs(10)), "nothing asked");
        assert!(owners.due(t0 + Owners::MIN_REFRESH + Owners::MAX_AGE));
    }
}
