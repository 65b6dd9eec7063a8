//! Enumeration returns every object that existed for the whole scan exactly once, even while
//! other keys are written and removed concurrently.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::TestCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enumeration_under_concurrent_writes_returns_stable_objects_exactly_once() {
    let cluster = TestCluster::start(2);
    let client = cluster.client();
    let table = client.create_table("scan", 4).await.unwrap();
    let stable: Vec<String> = (0..1_500).map(|index| format!("stable-{index}")).collect();
    for key in &stable {
        client.write(table, key.as_bytes(), b"v0").await.unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let client = client.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut round = 0u64;
            // Bounded: at most 20 000 operations even if the scan were slow.
            while !stop.load(Ordering::Relaxed) && round < 20_000 {
                let key = format!("churn-{}", round % 500);
                if round.is_multiple_of(3) {
                    client.remove(table, key.as_bytes()).await.unwrap();
                } else {
                    client.write(table, key.as_bytes(), b"churn").await.unwrap();
                }
                // Overwriting a stable object keeps it present; it must still appear once.
                let stable_key = format!("stable-{}", round % 1_500);
                client.write(table, stable_key.as_bytes(), b"v1").await.unwrap();
                round += 1;
            }
            round
        })
    };
    let mut seen: HashMap<Vec<u8>, usize> = HashMap::new();
    let mut enumeration = client.enumerate(table).with_batch_bytes(2_000);
    let mut batches = 0;
    while let Some(batch) = enumeration.next_batch().await.unwrap() {
        batches += 1;
        for object in batch {
            *seen.entry(object.key.to_vec()).or_default() += 1;
        }
        tokio::task::yield_now().await;
    }
    stop.store(true, Ordering::Relaxed);
    let churn_rounds = churn.await.unwrap();
    assert!(batches > 10, "small batches force many resumptions ({batches})");
    assert!(churn_rounds > 0);
    for key in &stable {
        assert_eq!(seen.get(key.as_bytes()), Some(&1), "{key} must be returned exactly once");
    }
    for (key, count) in &seen {
        assert_eq!(*count, 1, "{} returned {count} times", String::from_utf8_lossy(key));
    }
}
