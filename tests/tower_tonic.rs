//! The layer in a real tonic server: tonic's health service (a gRPC service without code
//! generation) on 127.0.0.1, called by tonic's client. A request past the limit gets gRPC
//! status 8 (RESOURCE_EXHAUSTED), and the peer address comes from tonic's `TcpConnectInfo`.
//!
//! Run with `cargo test --features tower --test tower_tonic`.

#![cfg(feature = "tower")]

use std::net::SocketAddr;

use tollgate::tower::{Key, KeySource, Policy, RateLimitLayer};
use tollgate::{Gcra, KeyedLimiter, Quota};
use tonic::transport::server::{TcpConnectInfo, TcpIncoming};
use tonic::transport::{Channel, Server};
use tonic::Code;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// Serves tonic's health service behind `layer` on an ephemeral loopback port.
async fn serve(layer: RateLimitLayer) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_reporter, health) = tonic_health::server::health_reporter();
    let server = tokio::spawn(async move {
        Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    (addr, server)
}

/// `n` health checks, each with `api_key` as `x-api-key` metadata when given: their gRPC codes.
async fn codes(addr: SocketAddr, api_key: Option<&str>, n: usize) -> Vec<Code> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let mut codes = Vec::new();
    for _ in 0..n {
        let mut request = tonic::Request::new(HealthCheckRequest {
            service: String::new(),
        });
        if let Some(key) = api_key {
            request
                .metadata_mut()
                .insert("x-api-key", key.parse().unwrap());
        }
        codes.push(match client.check(request).await {
            Ok(_) => Code::Ok,
            Err(status) => {
                if status.code() == Code::ResourceExhausted {
                    assert!(
                        status.message().contains("Rate limit \"grpc\" exceeded"),
                        "{status:?}"
                    );
                }
                status.code()
            }
        });
    }
    codes
}

fn two_an_hour() -> KeyedLimiter<Key, Gcra> {
    KeyedLimiter::new(Gcra::new(Quota::per_hour(2).unwrap()).unwrap())
}

#[tokio::test]
async fn calls_past_the_limit_get_resource_exhausted() {
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("grpc", two_an_hour()).key(KeySource::header(
            http::HeaderName::from_static("x-api-key"),
        )))
        .build()
        .unwrap();
    let (addr, server) = serve(layer).await;
    assert_eq!(
        codes(addr, Some("alice"), 3).await,
        [Code::Ok, Code::Ok, Code::ResourceExhausted]
    );
    // Another key has its own budget.
    assert_eq!(codes(addr, Some("bob"), 1).await, [Code::Ok]);
    server.abort();
}

#[tokio::test]
async fn the_peer_address_comes_from_tonic_connect_info() {
    let layer = RateLimitLayer::builder()
        .policy(Policy::new("grpc", two_an_hour()).key(KeySource::peer_ip()))
        .peer_addr(|parts| {
            parts
                .extensions
                .get::<TcpConnectInfo>()?
                .remote_addr()
                .map(|a| a.ip())
        })
        .build()
        .unwrap();
    let (addr, server) = serve(layer).await;
    // Two connections from 127.0.0.1 share one budget: keyed by IP, not by connection.
    assert_eq!(codes(addr, None, 1).await, [Code::Ok]);
    assert_eq!(
        codes(addr, None, 2).await,
        [Code::Ok, Code::ResourceExhausted]
    );
    server.abort();
}
