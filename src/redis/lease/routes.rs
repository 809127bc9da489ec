//! A leased node's routes: one on a single server; on a Cluster one per slot owner's breaker,
//! so that one master's failure hands over only the leases of its keys, and the other
//! masters' keys keep theirs. Each route is a `Route` as it is (`route.rs`, loom-modelled):
//! nothing is shared between two routes but the table that finds them.

use std::sync::Arc;

use super::route::{Route, Way};
use crate::redis::exact::RedisConnection;
use crate::redis::guard::{Gate, GuardedLimiter};

/// Where a node's checks go, per breaker.
pub(super) struct Routes {
    /// The route of the limiter's one breaker (a single server).
    one: Route,
    /// On a Cluster, a route per slot owner's breaker, added when a key of a new owner is
    /// first checked. Entries are kept (a route and a breaker each) for owners that left the
    /// map: a few per failover.
    owners: Option<Table>,
}

/// Each slot owner's breaker, and its route.
type Table = parking_lot::RwLock<Vec<(Gate, Arc<Route>)>>;

/// The route of one key's check, and the breaker it follows.
pub(super) struct RouteOf<'a> {
    route: Held<'a>,
    /// `None`: the limiter's one breaker.
    gate: Option<Gate>,
}

enum Held<'a> {
    One(&'a Route),
    Owner(Arc<Route>),
}

impl Routes {
    /// One route, or a table of them for a limiter on a Cluster.
    pub fn new(clustered: bool) -> Routes {
        Routes {
            one: Route::default(),
            owners: clustered.then(|| parking_lot::RwLock::new(Vec::new())),
        }
    }

    /// The route of `key`'s checks.
    #[inline]
    pub fn of<C: RedisConnection>(&self, guard: &GuardedLimiter<C>, key: &[u8]) -> RouteOf<'_> {
        let gate = self.owners.as_ref().and_then(|table| {
            let gate = guard.gate_of(key)?;
            Some((Self::find(table, &gate), gate))
        });
        match gate {
            Some((route, gate)) => RouteOf {
                route: Held::Owner(route),
                gate: Some(gate),
            },
            None => RouteOf {
                route: Held::One(&self.one),
                gate: None,
            },
        }
    }

    /// The route of `gate` in `table`, added if it has none.
    fn find(table: &Table, gate: &Gate) -> Arc<Route> {
        if let Some((_, route)) = table.read().iter().find(|(g, _)| g.same(gate)) {
            return Arc::clone(route);
        }
        let mut table = table.write();
        if let Some((_, route)) = table.iter().find(|(g, _)| g.same(gate)) {
            return Arc::clone(route);
        }
        let route = Arc::new(Route::default());
        table.push((gate.clone(), Arc::clone(&route)));
        route
    }
}

impl RouteOf<'_> {
    /// The route word.
    #[inline]
    pub fn route(&self) -> &Route {
        match &self.route {
            Held::One(route) => route,
            Held::Owner(route) => route,
        }
    }

    /// Where checks go now.
    #[inline]
    pub fn way(&self) -> Way {
        self.route().way()
    }

    /// Whether this route's breaker is open (the policy decides).
    #[inline]
    pub fn open<C: RedisConnection>(&self, guard: &GuardedLimiter<C>) -> bool {
        match &self.gate {
            Some(gate) => gate.is_open(),
            None => guard.is_open(),
        }
    }

    /// Whether `key`'s checks follow this route's breaker (a handover takes over only the
    /// leases of its own breaker's keys).
    pub fn covers<C: RedisConnection>(&self, guard: &GuardedLimiter<C>, key: &[u8]) -> bool {
        match (&self.gate, guard.gate_of(key)) {
            (Some(gate), Some(other)) => gate.same(&other),
            (None, _) => true,
            (Some(_), None) => false,
        }
    }
}
