//! Request handling.

use std::sync::Arc;

use stratus_env::WallClock;
use stratus_store::{ObjectError, ObjectStore, StoreConfig, WallTime};
use stratus_types::limits::KEY_BYTES_MAX;
use stratus_types::{key_hash, RpcIdentity, ServerId, TableId, Version};
use stratus_wire::{RecoveryTablet, Status};

use crate::client_leases::{ClientLeaseChecks, LeaseStanding};
use crate::flash_settings::FlashSettings;
use crate::lease::Lease;
use crate::metrics::MasterMetrics;
use crate::migration::{CompletedTransfers, IncomingTransfers};
use crate::ownership::{TabletOwnership, WriteRefusal};
use crate::recovery::RecoveryReader;
use crate::replication::ReplicaManager;

mod cleaner_threads;
mod dispatch;
mod durable_answer;
mod flash_reads;
mod migration_rpc;
mod objects;
mod recovery_rpc;
mod tiers;
mod transactions;

pub(crate) use objects::status_of;

/// Settings of a master.
#[derive(Clone, Debug)]
pub struct MasterConfig {
    /// The object store's memory layout.
    pub store: StoreConfig,
    /// Where segment images of the flash tier go (`None`: no flash tier; flash tables' objects
    /// then stay in memory). `store.flash_image_bytes` is its budget.
    pub flash_images: Option<Arc<dyn stratus_store::FlashImages>>,
    /// The flash tier's directory and disk budget as the server was started with them (`None`:
    /// no data directory, or `--flash-gib 0`): what `flash_images` is opened on, with
    /// `store.flash_image_bytes` its `bytes_max`. The master keeps them and opens nothing.
    pub flash: Option<FlashSettings>,
}

impl MasterConfig {
    /// A master with `store`'s layout and no flash tier.
    pub fn memory_only(store: StoreConfig) -> MasterConfig {
        MasterConfig { store, flash_images: None, flash: None }
    }
}

/// The master service of one storage server.
#[derive(Debug)]
pub struct Master {
    server_id: ServerId,
    store: Arc<ObjectStore>,
    /// Present unless the master runs memory-only (replicas = 0).
    replication: Option<ReplicaManager>,
    ownership: Arc<TabletOwnership>,
    /// Tablets being received from other masters (which transfer each range belongs to).
    incoming: IncomingTransfers,
    /// Transfers out of this master that completed (answered again when asked again).
    completed_transfers: Arc<CompletedTransfers>,
    wall_clock: Arc<dyn WallClock>,
    /// Requests per operation and their latencies; recovery work.
    metrics: Arc<MasterMetrics>,
    /// What a change to the log needs until it is acknowledged, in one place so a request
    /// takes one reference (present with replication).
    sync_context: Option<Arc<SyncContext>>,
    /// Present when this master may be asked to recover a crashed master's tablets.
    recovery: Option<RecoveryReader>,
    /// Present when this master is a member of a cluster: it serves only while the lease is
    /// valid (see `lease.rs`). Absent in tests that drive a master alone.
    lease: Option<Arc<Lease>>,
    /// Partitions being recovered here now. Two recoveries of overlapping ranges never run at
    /// once (a late one failing would drop what the other replayed), and no range this master
    /// serves is recovered into (replay's removals are not atomic with client writes).
    recoveries_in_flight: Arc<std::sync::Mutex<Vec<RecoveryTablet>>>,
    /// The client leases mutations are applied under (exactly-once).
    client_leases: Arc<ClientLeaseChecks>,
    /// The flash tier's settings the server was started with (`None`: it has none).
    flash: Option<FlashSettings>,
    /// Held while a table's tier is checked and recorded (`service/tiers.rs`, invariant 3).
    tier_changes: std::sync::Mutex<()>,
    /// Reads of flash tables in flight off the runtime's workers (`service/flash_reads.rs`).
    flash_reads: flash_reads::FlashReadGate,
}

/// What a request that changed the log needs until it is answered: the replica manager it
/// waits for, the lease it must still hold, and the metrics that time it. Shared by every such
/// request (one reference count per request, rather than one per part).
#[derive(Debug)]
struct SyncContext {
    replication: ReplicaManager,
    lease: Option<Arc<Lease>>,
    metrics: Arc<MasterMetrics>,
}

impl Master {
    /// A master with an empty log, for the server `server_id` (the log id in every segment
    /// header).
    pub fn new(
        server_id: ServerId,
        config: MasterConfig,
        wall_clock: Arc<dyn WallClock>,
    ) -> Result<Master, String> {
        config
            .store
            .validate()
            .map_err(|error| format!("invalid store configuration: {error:?}"))?;
        let memory = config.store.log_config().allocate_memory();
        Master::with_memory(server_id, config, wall_clock, memory)
    }

    /// [`Master::new`] with its log in `memory`, allocated (and prefaulted, which takes time)
    /// before the server enlisted: `config.store.log_config().allocate_memory()`.
    pub fn with_memory(
        server_id: ServerId,
        config: MasterConfig,
        wall_clock: Arc<dyn WallClock>,
        memory: stratus_log::seglet_memory::SegletMemory,
    ) -> Result<Master, String> {
        let MasterConfig { store, flash_images, flash } = config;
        let mut store = ObjectStore::with_memory(store, server_id, memory)
            .map_err(|error| format!("invalid store configuration: {error:?}"))?;
        if let Some(images) = flash_images {
            store.attach_flash(images);
        }
        let store = Arc::new(store);
        Ok(Master {
            server_id,
            client_leases: ClientLeaseChecks::vouching_all(store.clone()),
            store,
            replication: None,
            ownership: Arc::default(),
            incoming: IncomingTransfers::default(),
            completed_transfers: Arc::default(),
            wall_clock,
            metrics: Arc::default(),
            sync_context: None,
            recovery: None,
            lease: None,
            recoveries_in_flight: Arc::default(),
            flash,
            tier_changes: std::sync::Mutex::default(),
            flash_reads: flash_reads::FlashReadGate::default(),
        })
    }

    /// The object store (for statistics and tests).
    pub fn store(&self) -> &ObjectStore {
        &self.store
    }

    /// A shared handle on the object store, for the replica manager and the cleaner threads.
    pub fn store_handle(&self) -> Arc<ObjectStore> {
        self.store.clone()
    }

    /// Turns on replication: from now on a request that changes the log is answered only once
    /// `replication` holds the log up to it on every replica.
    pub fn set_replication(&mut self, replication: ReplicaManager) {
        self.replication = Some(replication);
        self.update_sync_context();
    }

    /// From now on, applies a mutation with an exactly-once identity only under a client
    /// lease the coordinator at `coordinator` vouched for (without this, every lease is taken
    /// as valid: a master alone, in tests). Returns the sweep to run (it forgets the results
    /// of clients whose lease expired).
    pub fn check_client_leases(
        &mut self,
        coordinator: String,
        network: Arc<dyn stratus_env::Network>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.client_leases = ClientLeaseChecks::new(self.store.clone(), coordinator, network);
        self.client_leases.clone().sweep()
    }

    /// From now on, serves object requests only while `lease` is valid.
    pub fn set_lease(&mut self, lease: Arc<Lease>) {
        self.lease = Some(lease);
        self.update_sync_context();
    }

    fn update_sync_context(&mut self) {
        self.sync_context = self.replication.as_ref().map(|replication| {
            Arc::new(SyncContext {
                replication: replication.clone(),
                lease: self.lease.clone(),
                metrics: self.metrics.clone(),
            })
        });
    }

    /// Requests per operation with their latencies, and recovery work.
    pub fn metrics(&self) -> &MasterMetrics {
        &self.metrics
    }

    /// Tablets of crashed masters being recovered here now.
    pub fn tablets_recovering(&self) -> usize {
        self.recoveries_in_flight.lock().unwrap_or_else(|poison| poison.into_inner()).len()
    }

    /// True unless a lease is required and not held (expired, or the server was declared
    /// crashed): the check every object request passes first (public for invariant checkers
    /// such as the simulation's single-owner check).
    pub fn may_serve(&self) -> bool {
        self.lease.as_ref().is_none_or(|lease| lease.valid())
    }

    /// Lets this master serve RECOVER_TABLETS, reading replicas through `reader`.
    pub fn set_recovery_reader(&mut self, reader: RecoveryReader) {
        self.recovery = Some(reader);
    }

    /// The replica manager, if replication is on.
    pub fn replication(&self) -> Option<&ReplicaManager> {
        self.replication.as_ref()
    }

    /// The tablets this master owns.
    pub fn ownership(&self) -> &TabletOwnership {
        &self.ownership
    }

    /// The flash tier's settings (`None`: this server has no flash tier).
    pub fn flash_settings(&self) -> Option<&FlashSettings> {
        self.flash.as_ref()
    }

    /// The master's wall clock now: what every object operation is applied at.
    fn now(&self) -> WallTime {
        WallTime::from_millis(self.wall_clock.now_millis())
    }

    /// Checks what every object request must satisfy before the store sees it: a valid lease,
    /// a valid key and an owned tablet. Without a lease the answer is RETRY: the coordinator
    /// may be slow (the lease comes back), or this master was declared crashed (it exits, and
    /// the client's retry then finds the tablet's new owner).
    fn admit(&self, table: TableId, key: &[u8]) -> Result<stratus_types::KeyHash, Status> {
        let hash = self.admit_key(table, key)?;
        if !self.ownership.owns(table, hash) {
            return Err(Status::UnknownTablet);
        }
        Ok(hash)
    }

    /// The lease and key checks of [`Master::admit`], without the ownership check.
    fn admit_key(&self, table: TableId, key: &[u8]) -> Result<stratus_types::KeyHash, Status> {
        if !self.may_serve() {
            return Err(Status::Retry);
        }
        if key.is_empty() || key.len() > KEY_BYTES_MAX {
            return Err(Status::InvalidKey);
        }
        Ok(key_hash(table, key))
    }

    /// Admits a mutation's exactly-once identity: its lease must be vouched for (RETRY while
    /// it is being checked, EXPIRED_LEASE once the coordinator said it expired).
    fn admit_rpc(&self, rpc: Option<RpcIdentity>) -> Result<(), Status> {
        let Some(rpc) = rpc else { return Ok(()) };
        match self.client_leases.standing(rpc.lease) {
            LeaseStanding::Vouched => Ok(()),
            LeaseStanding::Expired => Err(Status::ExpiredLease),
            LeaseStanding::Unknown => Err(Status::Retry),
        }
    }

    /// Admits a request that changes `key` of `table` and applies it with `apply` while the
    /// tablet can be neither frozen nor dropped (see `TabletOwnership::while_writable`). A
    /// tablet at the end of its transfer answers RETRY: the client tries again and finds the
    /// tablet writable or at its new master.
    fn mutate<T>(
        &self,
        table: TableId,
        key: &[u8],
        rpc: Option<RpcIdentity>,
        apply: impl FnOnce(stratus_types::KeyHash) -> Result<T, ObjectError>,
    ) -> Result<T, (Status, Version)> {
        let hash = self.admit_key(table, key).map_err(|status| (status, Version(0)))?;
        self.admit_rpc(rpc).map_err(|status| (status, Version(0)))?;
        match self.ownership.while_writable(table, hash, key, || apply(hash)) {
            Ok(Ok(applied)) => Ok(applied),
            Ok(Err(error)) => Err(status_of(error)),
            Err(WriteRefusal::NotOwned) => Err((Status::UnknownTablet, Version(0))),
            Err(WriteRefusal::Frozen) => Err((Status::Retry, Version(0))),
        }
    }
}
