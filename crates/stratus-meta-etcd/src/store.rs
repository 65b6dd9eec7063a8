//! [`EtcdMetaStore`]: the coordinator's [`MetaStore`] kept in etcd.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use stratus_meta::{validate_batch, MetaError, MetaOperation, MetaStore};

use crate::client::{prefix_end, Compare, EtcdClient, EtcdError, TxnOperation};
use crate::{leader_key, TXN_OPERATIONS_MAX};

/// A [`MetaStore`] whose map lives in etcd under `<namespace>data/`.
///
/// Every batch is one etcd transaction, so it is atomic and, once etcd answers, durable on a
/// majority of etcd's members. With a fence (the identity this coordinator wrote into the
/// leader key when it won the leadership, see [`crate::Leadership`]), the transaction also
/// requires the leader key to still hold that identity: a coordinator that was deposed, even
/// one that does not know it yet, can change nothing.
///
/// A batch whose outcome is unknown (etcd took the request but no answer came) poisons the
/// store, as the trait requires: the coordinator stops, and whoever takes over reads what etcd
/// really holds.
#[derive(Debug)]
pub struct EtcdMetaStore {
    client: Arc<EtcdClient>,
    namespace: String,
    fence: Option<Vec<u8>>,
    poisoned: Mutex<Option<String>>,
}

impl EtcdMetaStore {
    /// The store under `namespace` (e.g. "/stratus/default/"), its writes conditional on the
    /// leader key holding `fence` when one is given.
    pub fn new(client: Arc<EtcdClient>, namespace: &str, fence: Option<Vec<u8>>) -> EtcdMetaStore {
        EtcdMetaStore {
            client,
            namespace: namespace.to_string(),
            fence,
            poisoned: Mutex::new(None),
        }
    }

    /// Why the store refuses every call, if it does.
    pub fn poisoned(&self) -> Option<String> {
        self.poisoned.lock().unwrap_or_else(|poison| poison.into_inner()).clone()
    }

    fn check_usable(&self) -> Result<(), MetaError> {
        match self.poisoned() {
            Some(reason) => Err(MetaError::Poisoned { reason }),
            None => Ok(()),
        }
    }

    fn poison(&self, reason: String) {
        *self.poisoned.lock().unwrap_or_else(|poison| poison.into_inner()) = Some(reason);
    }

    fn data_key(&self, key: &str) -> Vec<u8> {
        format!("{}data/{key}", self.namespace).into_bytes()
    }

    fn data_prefix_bytes(&self) -> usize {
        self.namespace.len() + "data/".len()
    }
}

/// A read that failed: nothing changed, so the store stays usable.
fn read_failure(error: EtcdError) -> MetaError {
    MetaError::Unavailable { reason: error.to_string() }
}

impl MetaStore for EtcdMetaStore {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, MetaError> {
        self.check_usable()?;
        let key = self.data_key(key);
        let pairs = self.client.range(&key, &[]).map_err(read_failure)?;
        Ok(pairs.into_iter().find(|pair| pair.key == key).map(|pair| pair.value))
    }

    fn scan_prefix(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, MetaError> {
        self.check_usable()?;
        let start = self.data_key(prefix);
        let pairs = self.client.range(&start, &prefix_end(&start)).map_err(read_failure)?;
        let strip = self.data_prefix_bytes();
        pairs
            .into_iter()
            .map(|pair| {
                let key = String::from_utf8(pair.key[strip..].to_vec()).map_err(|_| {
                    MetaError::Corrupt { offset: 0, reason: "a key in etcd is not UTF-8".into() }
                })?;
                Ok((key, pair.value))
            })
            .collect()
    }

    fn apply(&self, batch: &[MetaOperation]) -> Result<(), MetaError> {
        self.check_usable()?;
        validate_batch(batch)?;
        // etcd refuses a transaction that names a key twice, so each key's last operation
        // stands for all of its operations: applying a batch in order leaves every key as its
        // last operation says, whatever came before.
        let mut last: BTreeMap<&str, &MetaOperation> = BTreeMap::new();
        for operation in batch {
            last.insert(operation.key(), operation);
        }
        if last.is_empty() {
            return Ok(());
        }
        if last.len() > TXN_OPERATIONS_MAX {
            return Err(MetaError::TooLarge { what: "batch", bytes: last.len() as u64 });
        }
        let operations: Vec<TxnOperation> = last
            .values()
            .map(|operation| match operation {
                MetaOperation::Put { key, value } => {
                    TxnOperation::Put { key: self.data_key(key), value: value.clone(), lease: 0 }
                }
                MetaOperation::Delete { key } => TxnOperation::Delete { key: self.data_key(key) },
            })
            .collect();
        let leader = leader_key(&self.namespace);
        let (compare, failure) = match &self.fence {
            Some(identity) => (
                vec![Compare::ValueEquals { key: leader.clone(), value: identity.clone() }],
                vec![TxnOperation::Get { key: leader }],
            ),
            None => (Vec::new(), Vec::new()),
        };
        match self.client.txn(&compare, &operations, &failure) {
            Ok(outcome) if outcome.succeeded => Ok(()),
            Ok(outcome) => {
                let holder = outcome
                    .ranges
                    .first()
                    .and_then(|pairs| pairs.first())
                    .map(|pair| String::from_utf8_lossy(&pair.value).into_owned())
                    .unwrap_or_else(|| "nobody (the leadership lease expired)".to_string());
                let reason = format!("the leadership is held by {holder}");
                // A deposed coordinator must never write again, whatever it does next.
                self.poison(reason.clone());
                Err(MetaError::Fenced { reason })
            }
            Err(error @ (EtcdError::Unreachable(_) | EtcdError::Refused(_))) => {
                Err(MetaError::Unavailable { reason: error.to_string() })
            }
            Err(error) => {
                let reason = error.to_string();
                self.poison(reason.clone());
                Err(MetaError::Poisoned { reason })
            }
        }
    }
}
