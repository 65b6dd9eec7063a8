//! Every data-model operation and every reject rule, end to end over real processes.

mod common;

use bytes::Bytes;
use common::TestCluster;
use stratus_client::{IncrementItem, KeyItem, RejectRules, Status, Version, WriteItem};

fn rules(doesnt_exist: bool, exists: bool, le: bool, ne: bool, given: u64) -> RejectRules {
    RejectRules {
        given_version: Version(given),
        doesnt_exist,
        exists,
        version_le_given: le,
        version_ne_given: ne,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_object_operations() {
    let cluster = TestCluster::start(1);
    let client = cluster.client();
    let table = client.create_table("objects", 1).await.unwrap();
    assert_eq!(client.create_table("objects", 1).await.unwrap(), table, "create is idempotent");
    assert_eq!(client.get_table_id("objects").await.unwrap(), table);

    let missing = client.read(table, b"k").await.unwrap_err();
    assert_eq!(missing.status, Status::ObjectDoesntExist);
    let first = client.write(table, b"k", b"one").await.unwrap();
    let (value, version) = client.read(table, b"k").await.unwrap();
    assert_eq!((&value[..], version), (&b"one"[..], first));
    let second = client.write(table, b"k", b"two").await.unwrap();
    assert!(second > first);
    assert_eq!(client.remove(table, b"k").await.unwrap(), second);
    assert_eq!(
        client.remove(table, b"k").await.unwrap(),
        Version(0),
        "removing a missing object is not an error"
    );
    let recreated = client.write(table, b"k", b"three").await.unwrap();
    assert!(recreated > second, "versions are never reused across delete and re-create");

    let (value, version) = client.increment(table, b"counter", 5).await.unwrap();
    assert_eq!(value, 5);
    let (value, next) = client.increment(table, b"counter", -7).await.unwrap();
    assert_eq!(value, -2);
    assert!(next > version);
    let (stored, _) = client.read(table, b"counter").await.unwrap();
    assert_eq!(&stored[..], &(-2i64).to_le_bytes()[..]);
    let not_integer = client.increment(table, b"k", 1).await.unwrap_err();
    assert_eq!(not_integer.status, Status::InvalidObject);
    let overflow = {
        client.write(table, b"big", &i64::MAX.to_le_bytes()).await.unwrap();
        client.increment(table, b"big", 1).await.unwrap_err()
    };
    assert_eq!(overflow.status, Status::InvalidObject);

    client.drop_table("objects").await.unwrap();
    assert_eq!(client.get_table_id("objects").await.unwrap_err().status, Status::TableDoesntExist);
    assert_eq!(client.read(table, b"k").await.unwrap_err().status, Status::TableDoesntExist);
}

/// Every combination of the four rules, on a missing and on a present object, for every
/// conditional operation: the outcome must match the rules' documented semantics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reject_rule_combination() {
    let cluster = TestCluster::start(1);
    let client = cluster.client();
    let table = client.create_table("rules", 1).await.unwrap();
    let mut case = 0u32;
    for mask in 0u8..16 {
        for present in [false, true] {
            for given_offset in [-1i64, 0, 1] {
                for operation in ["read", "write", "remove", "increment"] {
                    case += 1;
                    let key = format!("key-{case}");
                    let current = if present {
                        client.write(table, key.as_bytes(), &0i64.to_le_bytes()).await.unwrap()
                    } else {
                        Version(0)
                    };
                    let given = (current.0 as i64 + given_offset).max(0) as u64;
                    let rule =
                        rules(mask & 1 != 0, mask & 2 != 0, mask & 4 != 0, mask & 8 != 0, given);
                    // A read of a missing object reports it missing whatever the rules say
                    // (as RAMCloud does): there is no value to return. Every other
                    // operation applies the rules to version 0.
                    let expected = if operation == "read" && !present {
                        Err(stratus_types::RejectReason::ObjectDoesntExist)
                    } else {
                        rule.check(current)
                    };
                    let outcome = match operation {
                        "read" => client
                            .read_with(table, key.as_bytes(), rule)
                            .await
                            .map(|(_, version)| version),
                        "write" => {
                            client
                                .write_with(table, key.as_bytes(), Bytes::from_static(b"x"), rule)
                                .await
                        }
                        "remove" => client.remove_with(table, key.as_bytes(), rule).await,
                        _ => client
                            .increment_with(table, key.as_bytes(), 1, rule)
                            .await
                            .map(|(_, version)| version),
                    };
                    match (expected, outcome) {
                        (Ok(()), Ok(version)) => {
                            if operation == "read" || operation == "remove" {
                                assert_eq!(
                                    version, current,
                                    "{operation} {rule:?} present={present}"
                                );
                            } else {
                                assert!(
                                    version > current,
                                    "{operation} {rule:?} present={present}"
                                );
                            }
                        }
                        (Ok(()), Err(error)) => {
                            // A plain read of a missing object reports it missing.
                            assert!(
                                operation == "read" && !present,
                                "{operation} {rule:?}: {error}"
                            );
                            assert_eq!(error.status, Status::ObjectDoesntExist);
                        }
                        (Err(reason), Err(error)) => {
                            let status = match reason {
                                stratus_types::RejectReason::ObjectDoesntExist => {
                                    Status::ObjectDoesntExist
                                }
                                stratus_types::RejectReason::ObjectExists => Status::ObjectExists,
                                stratus_types::RejectReason::WrongVersion => Status::WrongVersion,
                            };
                            assert_eq!(
                                error.status, status,
                                "{operation} {rule:?} present={present}"
                            );
                            assert_eq!(
                                error.version, current,
                                "rejections report the current version"
                            );
                        }
                        (Err(reason), Ok(version)) => {
                            panic!("{operation} {rule:?} present={present} should be rejected ({reason:?}), got {version}")
                        }
                    }
                }
            }
        }
    }
    assert_eq!(case, 16 * 2 * 3 * 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_operations_span_two_masters() {
    let cluster = TestCluster::start(2);
    let client = cluster.client();
    let table = client.create_table("spread", 2).await.unwrap();
    let tablets = client.tablet_map(table).await.unwrap();
    assert_eq!(tablets.len(), 2);
    assert_ne!(tablets[0].owner, tablets[1].owner, "the two tablets live on different masters");

    let keys: Vec<Bytes> = (0..300).map(|index| Bytes::from(format!("key-{index:04}"))).collect();
    let writes: Vec<WriteItem> = keys
        .iter()
        .map(|key| WriteItem {
            table_id: table,
            key: key.clone(),
            value: key.clone(),
            rules: RejectRules::NONE,
            expiry: stratus_client::Expiry::Never,
        })
        .collect();
    let written = client.multi_write(&writes).await;
    assert!(written.iter().all(|result| result.is_ok()));

    let mut reads: Vec<KeyItem> = keys
        .iter()
        .map(|key| KeyItem { table_id: table, key: key.clone(), rules: RejectRules::NONE })
        .collect();
    reads.push(KeyItem {
        table_id: table,
        key: Bytes::from_static(b"absent"),
        rules: RejectRules::NONE,
    });
    let read = client.multi_read(&reads).await;
    for (index, result) in read.iter().take(keys.len()).enumerate() {
        let (value, version) = result.as_ref().unwrap();
        assert_eq!(value, &keys[index]);
        assert_eq!(*version, *written[index].as_ref().unwrap());
    }
    assert_eq!(read.last().unwrap().as_ref().unwrap_err().status, Status::ObjectDoesntExist);

    let increments: Vec<IncrementItem> = (0..50)
        .map(|index| IncrementItem {
            table_id: table,
            key: Bytes::from(format!("counter-{index}")),
            delta: index,
            rules: RejectRules::NONE,
        })
        .collect();
    for (index, result) in client.multi_increment(&increments).await.into_iter().enumerate() {
        assert_eq!(result.unwrap().0, index as i64);
    }

    let mut removes = reads.clone();
    removes[0].rules = RejectRules::version_equals(Version(u64::MAX));
    let removed = client.multi_remove(&removes).await;
    assert_eq!(removed[0].as_ref().unwrap_err().status, Status::WrongVersion);
    assert!(removed[1..keys.len()].iter().all(|result| result.is_ok()));
    let after = client.multi_read(&reads).await;
    assert!(after[0].is_ok(), "the rejected remove left its object");
    assert!(after[1..]
        .iter()
        .all(|result| result.as_ref().unwrap_err().status == Status::ObjectDoesntExist));

    let unknown = KeyItem {
        table_id: stratus_client::TableId(9_999),
        key: Bytes::from_static(b"k"),
        rules: RejectRules::NONE,
    };
    assert_eq!(
        client.multi_read(&[unknown]).await[0].as_ref().unwrap_err().status,
        Status::TableDoesntExist
    );
}
