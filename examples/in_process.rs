use tollgate::prelude::*;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 10 requests per second per client, bursts of up to 20.
    let limiter: KeyedLimiter<String, Gcra> =
        KeyedLimiter::new(Gcra::new(Quota::per_second(10)?.with_burst(20)?)?);

    for n in 1..=25 {
        // A &str lookup: no allocation once the key is known.
        let decision = limiter.check("203.0.113.7")?;
        if !decision.allowed() {
            // A server answers 429, with `Retry-After: decision.retry_after()`.
            let wait = decision.retry_after();
            println!("request {n} denied: retry after {wait:?}");
        }
    }
    Ok(())
}
