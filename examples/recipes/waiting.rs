use std::time::Duration;

use tollgate::prelude::*;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Calls to a partner API: 5 a second per tenant, waiting for a slot rather than failing.
    let limiter = KeyedLimiter::<String, _>::new(Gcra::new(Quota::per_second(5)?)?);
    for i in 0..12 {
        limiter.until_ready("tenant-7").await?;
        println!("call {i}");
    }
    // At most 100 ms of waiting, else give up.
    match limiter
        .acquire("tenant-7", Duration::from_millis(100))
        .await
    {
        Ok(_) => println!("one more call"),
        Err(e) => println!("gave up: {e}"),
    }
    Ok(())
}
