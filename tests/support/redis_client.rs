//! What the Redis tests share beside a server: a runtime, a Cluster connection of the test's
//! own, and which Cluster master serves a key.
//!
//! Include it with `#[path = "support/redis_client.rs"] mod redis_client;`.

#![allow(dead_code)]

/// A multi-threaded tokio runtime of `workers` threads, timers and I/O enabled.
pub fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// A Cluster connection to the nodes at `urls` (the test's own, beside its limiters').
pub async fn connect_cluster(urls: &[String]) -> redis::cluster_async::ClusterConnection {
    redis::cluster::ClusterClient::new(urls.to_vec())
        .expect("valid URLs")
        .get_async_connection()
        .await
        .expect("connects to the cluster")
}

/// The port of the Cluster master serving `key` (a state key), asked of the Cluster.
pub async fn master_of(conn: &redis::cluster_async::ClusterConnection, key: &[u8]) -> u16 {
    masters_of(conn, &[key.to_vec()]).await[0]
}

/// The port of the Cluster master serving each of `keys` (state keys, as the limiter writes
/// them), asked of the Cluster: `CLUSTER SLOTS`, then `CLUSTER KEYSLOT` for each key.
pub async fn masters_of(
    conn: &redis::cluster_async::ClusterConnection,
    keys: &[Vec<u8>],
) -> Vec<u16> {
    let mut conn = conn.clone();
    let ranges: Vec<Vec<redis::Value>> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut conn)
        .await
        .expect("CLUSTER SLOTS");
    // Each range: first slot, last slot, then the master as [host, port, id, …].
    let ranges: Vec<(u16, u16, u16)> = ranges
        .iter()
        .map(|range| {
            let lo: u16 = redis::from_redis_value(range[0].clone()).unwrap();
            let hi: u16 = redis::from_redis_value(range[1].clone()).unwrap();
            let master: Vec<redis::Value> = redis::from_redis_value(range[2].clone()).unwrap();
            let port: u16 = redis::from_redis_value(master[1].clone()).unwrap();
            (lo, hi, port)
        })
        .collect();
    let mut ports = Vec::new();
    for key in keys {
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("CLUSTER KEYSLOT");
        let port = ranges
            .iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
            .map(|r| r.2)
            .expect("a master serves every slot");
        ports.push(port);
    }
    ports
}

/// `keys` split by the master serving each one's state key (`state_key(key)`): those of the
/// master on `port`, then the others. Asserts that both sides have keys (at least 8 others),
/// as a test of one master's outage needs.
pub async fn split_by_master(
    conn: &redis::cluster_async::ClusterConnection,
    keys: &[String],
    state_key: impl Fn(&str) -> Vec<u8>,
    port: u16,
) -> (Vec<String>, Vec<String>) {
    let state_keys: Vec<Vec<u8>> = keys.iter().map(|k| state_key(k)).collect();
    let ports = masters_of(conn, &state_keys).await;
    let (on, off): (Vec<_>, Vec<_>) = keys
        .iter()
        .cloned()
        .zip(ports)
        .partition(|(_, master)| *master == port);
    let on: Vec<String> = on.into_iter().map(|(k, _)| k).collect();
    let off: Vec<String> = off.into_iter().map(|(k, _)| k).collect();
    assert!(!on.is_empty() && off.len() >= 8, "keys on every master");
    (on, off)
}
