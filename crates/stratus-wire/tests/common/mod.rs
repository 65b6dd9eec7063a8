//! Proptest strategies for every request and response variant, shared by the round-trip and
//! robustness tests.

#![allow(dead_code)] // Each test binary uses a different subset.

use bytes::Bytes;
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use stratus_types::{HashRange, RejectRules, SegmentId, ServerId, TableId, TabletState, Version};
use stratus_types::{Tier, TxDecision, TxOpKind, TxVote};
use stratus_wire::{
    AutoTableFigures, BackupDurability, BackupServiceStatistics, BackupWriteFlags,
    EnumeratedObject, EnumerationCursor, IncrementItem, IncrementItemResult, KeyItem,
    ReadItemResult, RecoveryReplica, RecoverySegment, RecoveryTablet, ReplicaCertificate,
    ReplicaEntry, Request, Response, ServerEntry, ServerStatistics, ServerStatus, ServiceMask,
    Status, TableEntry, TabletEntry, TxDecisionOp, TxOp, TxVoteItem, VersionItemResult, WriteItem,
};

/// Valid user names.
pub fn user_name() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9_.@-]{1,64}".prop_filter("not default", |name| name != "default")
}

/// Valid grant lists.
pub fn grants() -> impl Strategy<Value = Vec<stratus_wire::TableGrant>> {
    vec(
        ("[a-z*?-]{1,20}", 1u8..8).prop_map(|(pattern, bits)| stratus_wire::TableGrant {
            pattern,
            access: stratus_wire::TableAccess::from_bits(bits).expect("defined bits"),
        }),
        0..4,
    )
}

/// Valid user records, with or without credentials.
pub fn user_record() -> impl Strategy<Value = stratus_wire::UserRecord> {
    (
        user_name(),
        any::<bool>(),
        option::of((any::<[u8; 16]>(), any::<[u8; 32]>(), any::<[u8; 32]>())),
        grants(),
    )
        .prop_map(|(name, enabled, credentials, grants)| stratus_wire::UserRecord {
            name,
            enabled,
            credentials: credentials.map(|(salt, stored_key, server_key)| {
                stratus_wire::UserCredentials { salt, stored_key, server_key }
            }),
            grants,
        })
}

/// Every kind of identity.
pub fn identity() -> impl Strategy<Value = stratus_wire::Identity> {
    prop_oneof![
        Just(stratus_wire::Identity::Open),
        Just(stratus_wire::Identity::Member),
        Just(stratus_wire::Identity::Default),
        Just(stratus_wire::Identity::Anonymous),
        (user_name(), grants())
            .prop_map(|(name, grants)| stratus_wire::Identity::User { name, grants }),
    ]
}

/// Valid directories: users ascending by distinct name, tables ascending by distinct id.
pub fn user_directory() -> impl Strategy<Value = stratus_wire::UserDirectorySnapshot> {
    (
        any::<u64>(),
        any::<u64>(),
        vec(user_record(), 0..3),
        proptest::collection::btree_map(any::<u64>(), "[a-z]{1,8}", 0..3),
    )
        .prop_map(|(version, next, users, tables)| {
            let mut users: Vec<_> = users;
            users.sort_by(|a, b| a.name.cmp(&b.name));
            users.dedup_by(|a, b| a.name == b.name);
            stratus_wire::UserDirectorySnapshot {
                version,
                next_table_id: TableId(next),
                users,
                tables: tables.into_iter().map(|(id, name)| (TableId(id), name)).collect(),
            }
        })
}

/// Keys, including the empty key (decodable; the master refuses it).
pub fn key() -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..24).prop_map(Bytes::from)
}

/// Values, including empty ones.
pub fn value() -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..48).prop_map(Bytes::from)
}

/// Short strings with multi-byte characters, within every name limit.
pub fn name() -> impl Strategy<Value = String> {
    "\\PC{0,16}"
}

pub fn table_id() -> impl Strategy<Value = TableId> {
    any::<u64>().prop_map(TableId)
}

pub fn server_id() -> impl Strategy<Value = ServerId> {
    any::<u64>().prop_map(ServerId)
}

pub fn version() -> impl Strategy<Value = Version> {
    any::<u64>().prop_map(Version)
}

pub fn segment_id() -> impl Strategy<Value = SegmentId> {
    any::<u64>().prop_map(SegmentId)
}

/// Every storage tier this version defines.
pub fn tier() -> impl Strategy<Value = Tier> {
    proptest::sample::select(Tier::ALL.to_vec())
}

pub fn certificate() -> impl Strategy<Value = ReplicaCertificate> {
    (any::<u32>(), any::<u32>())
        .prop_map(|(segment_length, checksum)| ReplicaCertificate { segment_length, checksum })
}

pub fn backup_write_flags() -> impl Strategy<Value = BackupWriteFlags> {
    any::<[bool; 3]>().prop_map(|[open, close, primary]| BackupWriteFlags { open, close, primary })
}

pub fn expiry() -> impl Strategy<Value = stratus_types::Expiry> {
    use stratus_types::Expiry;
    prop_oneof![
        Just(Expiry::Never),
        Just(Expiry::Keep),
        any::<u64>().prop_map(Expiry::AfterMillis),
        any::<u64>().prop_map(Expiry::AtMillis),
    ]
}

pub fn rules() -> impl Strategy<Value = RejectRules> {
    (any::<u64>(), any::<[bool; 4]>()).prop_map(|(given, [a, b, c, d])| RejectRules {
        given_version: Version(given),
        doesnt_exist: a,
        exists: b,
        version_le_given: c,
        version_ne_given: d,
    })
}

pub fn range() -> impl Strategy<Value = HashRange> {
    (any::<u64>(), any::<u64>()).prop_map(|(a, b)| HashRange { start: a.min(b), end: a.max(b) })
}

pub fn recovery_tablet() -> impl Strategy<Value = RecoveryTablet> {
    (table_id(), range(), segment_id(), tier()).prop_map(
        |(table_id, range, creation_segment, tier)| RecoveryTablet {
            table_id,
            range,
            creation_segment,
            tier,
        },
    )
}

pub fn cursor() -> impl Strategy<Value = EnumerationCursor> {
    (any::<u64>(), option::of(key()))
        .prop_map(|(reversed_hash, after_key)| EnumerationCursor { reversed_hash, after_key })
}

pub fn services() -> impl Strategy<Value = ServiceMask> {
    (0..=ServiceMask::KNOWN).prop_map(ServiceMask)
}

/// Any status (items of multi-op results may carry any of them).
pub fn any_status() -> impl Strategy<Value = Status> {
    proptest::sample::select(Status::ALL.to_vec())
}

/// Statuses whose response carries the operation body.
pub fn operation_status() -> impl Strategy<Value = Status> {
    proptest::sample::select(
        Status::ALL
            .iter()
            .copied()
            .filter(|status| status.carries_operation_body())
            .collect::<Vec<_>>(),
    )
}

/// Statuses whose response carries an error body.
pub fn error_status() -> impl Strategy<Value = Status> {
    proptest::sample::select(
        Status::ALL
            .iter()
            .copied()
            .filter(|status| !status.carries_operation_body())
            .collect::<Vec<_>>(),
    )
}

/// An exactly-once identity that can be right (lease and rpc id at least 1, acknowledging
/// only ids below its own).
pub fn rpc_identity() -> impl Strategy<Value = stratus_types::RpcIdentity> {
    (1..u64::MAX, 1..u64::MAX, any::<u64>()).prop_map(|(lease, rpc, acknowledged)| {
        stratus_types::RpcIdentity {
            lease: stratus_types::LeaseId(lease),
            rpc: stratus_types::RpcId(rpc),
            acknowledged: stratus_types::RpcId(acknowledged % rpc),
        }
    })
}

/// An optional identity.
pub fn rpc() -> impl Strategy<Value = Option<stratus_types::RpcIdentity>> {
    option::of(rpc_identity())
}

fn remove_item() -> impl Strategy<Value = stratus_wire::RemoveItem> {
    (table_id(), key(), rules(), rpc()).prop_map(|(table_id, key, rules, rpc)| {
        stratus_wire::RemoveItem { table_id, key, rules, rpc }
    })
}

fn migrated_completion() -> impl Strategy<Value = stratus_wire::MigratedCompletion> {
    (any::<u64>(), rpc_identity(), version(), option::of(any::<i64>())).prop_map(
        |(key_hash, identity, version, integer)| stratus_wire::MigratedCompletion {
            key_hash,
            lease: identity.lease,
            rpc: identity.rpc,
            acknowledged: identity.acknowledged,
            version,
            integer,
        },
    )
}

/// An rpc id of a transaction's op: above what its client acknowledged.
fn op_rpc(acknowledged: u64, raw: u64) -> stratus_types::RpcId {
    // acknowledged < transaction < u64::MAX, so the modulus is at least 1.
    stratus_types::RpcId(acknowledged + 1 + raw % (u64::MAX - acknowledged))
}

/// A vote of TX_PREPARE or TX_REQUEST_ABORT.
fn tx_vote() -> impl Strategy<Value = TxVoteItem> {
    (any_status(), prop_oneof![Just(TxVote::Prepared), Just(TxVote::Abort)], version())
        .prop_map(|(status, vote, version)| TxVoteItem { status, vote, version })
}

fn tx_kind() -> impl Strategy<Value = TxOpKind> {
    prop_oneof![Just(TxOpKind::Read), Just(TxOpKind::Write), Just(TxOpKind::Remove)]
}

/// Raw transaction op names: table, key hash, raw rpc id (see [`op_rpc`]).
fn tx_op_names(count: std::ops::Range<usize>) -> impl Strategy<Value = Vec<(TableId, u64, u64)>> {
    vec((table_id(), any::<u64>(), any::<u64>()), count)
}

/// Transaction op names with rpc ids above `acknowledged`.
fn tx_decision_ops(acknowledged: u64, raw: Vec<(TableId, u64, u64)>) -> Vec<TxDecisionOp> {
    raw.into_iter()
        .map(|(table_id, key_hash, rpc)| TxDecisionOp {
            table_id,
            key_hash,
            rpc: op_rpc(acknowledged, rpc),
        })
        .collect()
}

/// A TX_PREPARE that can be right: lease and transaction id at least 1, acknowledging only
/// ids below the transaction's and its ops', values only on writes, only reads when
/// validate-only, participants exactly when not validate-only.
pub fn tx_prepare() -> impl Strategy<Value = Request> {
    let op = (table_id(), key(), any::<u64>(), tx_kind(), version(), value());
    let validation = (any::<bool>(), tx_op_names(1..5));
    (1..u64::MAX, 1..u64::MAX, any::<u64>(), validation, vec(op, 0..4)).prop_map(
        |(lease, transaction, acknowledged, (validate_only, participants), ops)| {
            let acknowledged = acknowledged % transaction;
            let ops = ops
                .into_iter()
                .map(|(table_id, key, rpc, kind, version_read, value)| {
                    let kind = if validate_only { TxOpKind::Read } else { kind };
                    let value = if kind == TxOpKind::Write { value } else { Bytes::new() };
                    let rpc = op_rpc(acknowledged, rpc);
                    TxOp { table_id, key, rpc, kind, version_read, value }
                })
                .collect();
            let participants = match validate_only {
                true => Vec::new(),
                false => tx_decision_ops(acknowledged, participants),
            };
            Request::TxPrepare {
                lease: stratus_types::LeaseId(lease),
                acknowledged: stratus_types::RpcId(acknowledged),
                transaction: stratus_types::RpcId(transaction),
                validate_only,
                ops,
                participants,
            }
        },
    )
}

/// A TX_DECISION that can be right (as [`tx_prepare`]).
pub fn tx_decision() -> impl Strategy<Value = Request> {
    let decision = prop_oneof![Just(TxDecision::Commit), Just(TxDecision::Abort)];
    (1..u64::MAX, 1..u64::MAX, any::<u64>(), decision, tx_op_names(0..4)).prop_map(
        |(lease, transaction, acknowledged, decision, ops)| {
            let acknowledged = acknowledged % transaction;
            let ops = tx_decision_ops(acknowledged, ops);
            Request::TxDecision {
                lease: stratus_types::LeaseId(lease),
                acknowledged: stratus_types::RpcId(acknowledged),
                transaction: stratus_types::RpcId(transaction),
                decision,
                ops,
            }
        },
    )
}

/// A TX_REQUEST_ABORT that can be right: lease, transaction and every rpc id at least 1.
pub fn tx_request_abort() -> impl Strategy<Value = Request> {
    (1..u64::MAX, 1..u64::MAX, tx_op_names(0..4)).prop_map(|(lease, transaction, ops)| {
        Request::TxRequestAbort {
            lease: stratus_types::LeaseId(lease),
            transaction: stratus_types::RpcId(transaction),
            ops: tx_decision_ops(0, ops),
        }
    })
}

fn key_item() -> impl Strategy<Value = KeyItem> {
    (table_id(), key(), rules()).prop_map(|(table_id, key, rules)| KeyItem { table_id, key, rules })
}

pub fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        Just(Request::Ping),
        (name(), services(), server_id(), failure_domain()).prop_map(
            |(address, services, previous_server_id, failure_domain)| Request::EnlistServer {
                address,
                services,
                previous_server_id,
                failure_domain
            }
        ),
        Just(Request::GetServerList),
        (name(), any::<u32>(), tier()).prop_map(|(name, server_span, tier)| {
            Request::CreateTable { name, server_span, tier }
        }),
        name().prop_map(|name| Request::DropTable { name }),
        name().prop_map(|name| Request::GetTableId { name }),
        Just(Request::ListTables),
        table_id().prop_map(|table_id| Request::GetTabletMap { table_id }),
        (table_id(), any::<u32>(), server_id()).prop_map(|(table_id, wait_millis, stale_owner)| {
            Request::AwaitTabletMap { table_id, wait_millis, stale_owner }
        }),
        (name(), any::<u64>())
            .prop_map(|(name, split_hash)| Request::SplitTablet { name, split_hash }),
        (name(), any::<u64>(), server_id()).prop_map(|(name, start_hash, target)| {
            Request::MigrateTablet { name, start_hash, target }
        }),
        (server_id(), table_id(), range(), any::<u64>(), server_id(), name()).prop_map(
            |(master_id, table_id, range, assignment_epoch, target, target_address)| {
                Request::TransferTablet {
                    master_id,
                    table_id,
                    range,
                    assignment_epoch,
                    target,
                    target_address,
                }
            },
        ),
        (
            (table_id(), range(), any::<u64>(), server_id(), any::<u64>()),
            (version(), tier()),
            any::<bool>(),
            vec(
                (key(), value(), version(), proptest::option::of(any::<u64>())).prop_map(
                    |(key, value, version, expires_at)| EnumeratedObject {
                        key,
                        value,
                        version,
                        expires_at: expires_at.map(stratus_types::ExpiresAt),
                    }
                ),
                0..4
            ),
            vec(key(), 0..3),
            vec(migrated_completion(), 0..3)
        )
            .prop_map(
                |(
                    (table_id, range, assignment_epoch, source, transfer_id),
                    (safe_version, tier),
                    first,
                    objects,
                    removed_keys,
                    completions,
                )| {
                    Request::ReceiveMigrationData {
                        table_id,
                        range,
                        assignment_epoch,
                        source,
                        transfer_id,
                        safe_version,
                        first,
                        tier,
                        objects,
                        removed_keys,
                        completions,
                    }
                }
            ),
        (table_id(), key(), rules()).prop_map(|(table_id, key, rules)| Request::Read {
            table_id,
            key,
            rules
        }),
        (table_id(), key(), value(), rules(), expiry(), rpc()).prop_map(
            |(table_id, key, value, rules, expiry, rpc)| Request::Write {
                table_id,
                key,
                value,
                rules,
                expiry,
                rpc
            }
        ),
        (table_id(), key(), expiry(), rules(), rpc()).prop_map(
            |(table_id, key, expiry, rules, rpc)| {
                Request::SetExpiry { table_id, key, expiry, rules, rpc }
            }
        ),
        (table_id(), key(), rules(), rpc()).prop_map(|(table_id, key, rules, rpc)| {
            Request::Remove { table_id, key, rules, rpc }
        }),
        (table_id(), key(), any::<i64>(), rules(), rpc()).prop_map(
            |(table_id, key, delta, rules, rpc)| {
                Request::Increment { table_id, key, delta, rules, rpc }
            }
        ),
        vec(key_item(), 0..4).prop_map(|items| Request::MultiRead { items }),
        tx_prepare(),
        tx_decision(),
        tx_request_abort(),
        vec(
            (table_id(), key(), value(), rules(), expiry(), rpc()).prop_map(
                |(table_id, key, value, rules, expiry, rpc)| WriteItem {
                    table_id,
                    key,
                    value,
                    rules,
                    expiry,
                    rpc
                }
            ),
            0..4
        )
        .prop_map(|items| Request::MultiWrite { items }),
        vec(remove_item(), 0..4).prop_map(|items| Request::MultiRemove { items }),
        vec(
            (table_id(), key(), any::<i64>(), rules(), rpc()).prop_map(
                |(table_id, key, delta, rules, rpc)| IncrementItem {
                    table_id,
                    key,
                    delta,
                    rules,
                    rpc
                }
            ),
            0..4
        )
        .prop_map(|items| Request::MultiIncrement { items }),
        (table_id(), range(), cursor(), any::<u32>()).prop_map(
            |(table_id, range, cursor, bytes_max)| Request::Enumerate {
                table_id,
                range,
                cursor,
                bytes_max
            }
        ),
        (server_id(), table_id(), range(), any::<u64>(), tier()).prop_map(
            |(master_id, table_id, range, assignment_epoch, tier)| {
                Request::TakeTabletOwnership { master_id, table_id, range, assignment_epoch, tier }
            }
        ),
        (server_id(), table_id(), range(), any::<u64>()).prop_map(
            |(master_id, table_id, range, assignment_epoch)| Request::DropTabletOwnership {
                master_id,
                table_id,
                range,
                assignment_epoch,
            }
        ),
        (server_id(), table_id(), range(), any::<u64>()).prop_map(
            |(master_id, table_id, range, assignment_epoch)| Request::AbandonMigration {
                master_id,
                table_id,
                range,
                assignment_epoch,
            }
        ),
        Just(Request::GetServerStatistics),
        (
            server_id(),
            segment_id(),
            any::<u64>(),
            any::<u32>(),
            backup_write_flags(),
            certificate(),
            value()
        )
            .prop_map(
                |(master_id, segment_id, epoch, offset, flags, certificate, data)| {
                    Request::BackupWrite {
                        master_id,
                        segment_id,
                        epoch,
                        offset,
                        flags,
                        certificate,
                        data,
                    }
                }
            ),
        (server_id(), segment_id())
            .prop_map(|(master_id, segment_id)| Request::BackupFree { master_id, segment_id }),
        server_id().prop_map(|master_id| Request::BackupListReplicas { master_id }),
        (server_id(), vec(segment_id(), 0..4)).prop_map(|(master_id, segment_ids)| {
            Request::ReplicasNeeded { master_id, segment_ids }
        }),
        (server_id(), segment_id()).prop_map(|(master_id, segment_id)| {
            Request::BackupReadReplica { master_id, segment_id }
        }),
        Just(Request::BackupGetStatistics),
        server_id().prop_map(|master_id| Request::BackupFenceMaster { master_id }),
        server_id().prop_map(|server_id| Request::RenewLease { server_id }),
        any::<u64>()
            .prop_map(|lease| Request::ClientLease { lease: stratus_types::LeaseId(lease) }),
        vec(any::<u64>().prop_map(stratus_types::LeaseId), 0..4)
            .prop_map(|leases| Request::CheckClientLeases { leases }),
        user_record().prop_map(|user| Request::SetUser { user }),
        user_name().prop_map(|name| Request::DeleteUser { name }),
        Just(Request::ListUsers),
        Just(Request::WhoAmI),
        any::<u64>().prop_map(|known_version| Request::GetUserDirectory { known_version }),
        server_id().prop_map(|server_id| Request::HintServerCrashed { server_id }),
        server_id().prop_map(|server_id| Request::ServerStopping { server_id }),
        server_id().prop_map(|server_id| Request::RecoveryAcceptLoss { server_id }),
        (server_id(), segment_id(), any::<u64>()).prop_map(|(server_id, segment_id, epoch)| {
            Request::SetLogHead { server_id, segment_id, epoch }
        }),
        (server_id(), segment_id(), vec(recovery_tablet(), 0..4)).prop_map(
            |(master_id, segment_id, tablets)| Request::BackupGetRecoveryData {
                master_id,
                segment_id,
                tablets
            }
        ),
        (server_id(), vec(segment_id(), 0..6), vec(vec(recovery_tablet(), 0..4), 0..4)).prop_map(
            |(master_id, segments, partitions)| Request::BackupStartPartitioning {
                master_id,
                segments,
                partitions
            }
        ),
        (
            server_id(),
            vec(recovery_tablet(), 0..4),
            vec(name(), 0..3),
            vec(
                (
                    segment_id(),
                    vec((any::<u16>(), any::<u64>(), any::<u32>(), any::<bool>()), 0..4)
                ),
                0..6
            ),
            any::<u64>()
        )
            .prop_map(|(crashed_master, tablets, backups, segments, assignment_epoch)| {
                // The recovery master's id: any id encodes alike.
                let master_id = ServerId(crashed_master.0 ^ 1);
                // Every replica names one of the backups (none without any).
                let segments = segments
                    .into_iter()
                    .map(|(segment_id, replicas)| RecoverySegment {
                        segment_id,
                        replicas: replicas
                            .into_iter()
                            .filter(|_| !backups.is_empty())
                            .map(|(backup, epoch, length, primary)| RecoveryReplica {
                                backup: backup % backups.len() as u16,
                                epoch,
                                length,
                                primary,
                            })
                            .collect(),
                    })
                    .collect();
                Request::RecoverTablets {
                    master_id,
                    crashed_master,
                    tablets,
                    backups,
                    segments,
                    assignment_epoch,
                }
            }),
    ]
}

fn replica_entry() -> impl Strategy<Value = ReplicaEntry> {
    (server_id(), segment_id(), any::<u64>(), certificate(), any::<[bool; 2]>()).prop_map(
        |(master_id, segment_id, epoch, certificate, [closed, primary])| ReplicaEntry {
            master_id,
            segment_id,
            epoch,
            certificate,
            closed,
            primary,
        },
    )
}

/// A failure domain: empty or up to the limit of printable ASCII.
fn failure_domain() -> impl Strategy<Value = String> {
    "[!-~]{0,64}"
}

fn server_entry() -> impl Strategy<Value = ServerEntry> {
    (server_id(), name(), services(), 0u8..4, failure_domain()).prop_map(
        |(server_id, address, services, status, failure_domain)| {
            let status = match status {
                0 => ServerStatus::Up,
                1 => ServerStatus::Crashed,
                2 => ServerStatus::Removed,
                _ => ServerStatus::Stopped,
            };
            ServerEntry { server_id, address, services, status, failure_domain }
        },
    )
}

fn tablet_entry() -> impl Strategy<Value = TabletEntry> {
    let state = prop_oneof![
        Just(TabletState::Normal),
        Just(TabletState::Recovering),
        Just(TabletState::Unavailable),
    ];
    (table_id(), range(), server_id(), name(), state).prop_map(
        |(table_id, range, owner, owner_address, state)| TabletEntry {
            table_id,
            range,
            owner,
            owner_address,
            state,
        },
    )
}

fn statistics() -> impl Strategy<Value = ServerStatistics> {
    (
        server_id(),
        any::<[u64; 7]>(),
        any::<u32>(),
        any::<u64>(),
        any::<u32>(),
        any::<[u64; 7]>(),
        any::<[u64; 4]>(),
        proptest::collection::vec(auto_table_figures(), 0..4),
    )
        .prop_map(|(server_id, counters, tablets_owned, requests_served, replicas, more, memory, auto_tables)| {
            let [process_resident, log_resident, log_target, hash_table] = memory;
            let [total, live, allocated, seglets, free, segments, objects] = counters;
            let [live_objects, replicated, cleaner_replicated, cleaned, relocated, compactions, compacted] =
                more;
            ServerStatistics {
                server_id,
                log_bytes_total: total,
                log_bytes_live: live,
                log_bytes_allocated: allocated,
                seglets_total: seglets,
                seglets_free: free,
                segments_in_log: segments,
                objects_live: objects,
                tablets_owned,
                requests_served,
                replicas,
                log_bytes_live_objects: live_objects,
                bytes_replicated: replicated,
                cleaner_bytes_replicated: cleaner_replicated,
                segments_cleaned: cleaned,
                cleaner_bytes_relocated: relocated,
                compactions,
                bytes_compacted: compacted,
                process_resident_bytes: process_resident,
                log_bytes_resident: log_resident,
                log_bytes_target: log_target,
                hash_table_bytes: hash_table,
                auto_tables,
            }
        })
}

fn auto_table_figures() -> impl Strategy<Value = AutoTableFigures> {
    (any::<u64>(), any::<[u64; 8]>()).prop_map(|(table, counts)| {
        let [dram_objects, dram_bytes, flash_objects, flash_bytes, from_dram, from_flash, promotions, demoted] =
            counts;
        AutoTableFigures {
            table_id: TableId(table),
            dram_objects,
            dram_bytes,
            flash_objects,
            flash_bytes,
            reads_from_dram: from_dram,
            reads_from_flash: from_flash,
            promotions,
            objects_demoted: demoted,
        }
    })
}

fn version_result() -> impl Strategy<Value = VersionItemResult> {
    (any_status(), version()).prop_map(|(status, version)| VersionItemResult { status, version })
}

pub fn response() -> impl Strategy<Value = Response> {
    prop_oneof![
        Just(Response::Ping),
        server_id().prop_map(|server_id| Response::EnlistServer { server_id }),
        vec(server_entry(), 0..4).prop_map(|servers| Response::GetServerList { servers }),
        table_id().prop_map(|table_id| Response::CreateTable { table_id }),
        Just(Response::DropTable),
        table_id().prop_map(|table_id| Response::GetTableId { table_id }),
        vec(
            (name(), table_id(), any::<u32>(), tier()).prop_map(
                |(name, table_id, tablet_count, tier)| TableEntry {
                    name,
                    table_id,
                    tablet_count,
                    tier,
                }
            ),
            0..4
        )
        .prop_map(|tables| Response::ListTables { tables }),
        vec(tablet_entry(), 0..4).prop_map(|tablets| Response::GetTabletMap { tablets }),
        vec(tablet_entry(), 0..4).prop_map(|tablets| Response::AwaitTabletMap { tablets }),
        (version(), value(), any::<u64>()).prop_map(|(version, value, expires_in_millis)| {
            Response::Read { version, value, expires_in_millis }
        }),
        version().prop_map(|version| Response::SetExpiry { version }),
        version().prop_map(|version| Response::Write { version }),
        version().prop_map(|version| Response::Remove { version }),
        (version(), any::<i64>())
            .prop_map(|(version, value)| Response::Increment { version, value }),
        vec(
            (any_status(), version(), value())
                .prop_map(|(status, version, value)| ReadItemResult { status, version, value }),
            0..4
        )
        .prop_map(|results| Response::MultiRead { results }),
        vec(version_result(), 0..4).prop_map(|results| Response::MultiWrite { results }),
        vec(tx_vote(), 0..4).prop_map(|votes| Response::TxPrepare { votes }),
        vec(tx_vote(), 0..4).prop_map(|votes| Response::TxRequestAbort { votes }),
        vec(any_status(), 0..4).prop_map(|results| Response::TxDecision { results }),
        vec(version_result(), 0..4).prop_map(|results| Response::MultiRemove { results }),
        vec(
            (any_status(), version(), any::<i64>()).prop_map(|(status, version, value)| {
                IncrementItemResult { status, version, value }
            }),
            0..4
        )
        .prop_map(|results| Response::MultiIncrement { results }),
        (
            vec(
                (key(), value(), version(), proptest::option::of(any::<u64>())).prop_map(
                    |(key, value, version, expires_at)| EnumeratedObject {
                        key,
                        value,
                        version,
                        expires_at: expires_at.map(stratus_types::ExpiresAt),
                    }
                ),
                0..4
            ),
            option::of(cursor())
        )
            .prop_map(|(objects, next)| Response::Enumerate { objects, next }),
        Just(Response::TakeTabletOwnership),
        Just(Response::DropTabletOwnership),
        statistics().prop_map(|statistics| Response::GetServerStatistics { statistics }),
        Just(Response::BackupWrite),
        Just(Response::BackupFree),
        vec(segment_id(), 0..4).prop_map(|not_needed| Response::ReplicasNeeded { not_needed }),
        any::<u64>().prop_map(|objects_dropped| Response::AbandonMigration { objects_dropped }),
        vec(replica_entry(), 0..4).prop_map(|replicas| Response::BackupListReplicas { replicas }),
        (any::<u64>(), any::<u32>(), any::<[bool; 2]>(), value()).prop_map(
            |(epoch, checksum, [closed, primary], data)| Response::BackupReadReplica {
                epoch,
                // The decoder insists the data is exactly the certified length.
                certificate: ReplicaCertificate { segment_length: data.len() as u32, checksum },
                closed,
                primary,
                data,
            }
        ),
        backup_statistics().prop_map(|statistics| Response::BackupGetStatistics { statistics }),
        Just(Response::BackupFenceMaster),
        Just(Response::SetLogHead),
        Just(Response::HintServerCrashed),
        Just(Response::ServerStopping),
        Just(Response::RecoveryAcceptLoss),
        Just(Response::SplitTablet),
        Just(Response::MigrateTablet),
        (segment_id(), any::<u64>()).prop_map(|(creation_segment, objects_sent)| {
            Response::TransferTablet { creation_segment, objects_sent }
        }),
        segment_id()
            .prop_map(|creation_segment| Response::ReceiveMigrationData { creation_segment }),
        any::<u32>().prop_map(|lease_ms| Response::RenewLease { lease_ms }),
        any::<bool>().prop_map(|created| Response::SetUser { created }),
        any::<bool>().prop_map(|existed| Response::DeleteUser { existed }),
        vec(
            (user_name(), any::<bool>(), any::<bool>(), grants()).prop_map(
                |(name, enabled, has_password, grants)| stratus_wire::UserSummary {
                    name,
                    enabled,
                    has_password,
                    grants
                }
            ),
            0..3
        )
        .prop_map(|users| Response::ListUsers { users }),
        identity().prop_map(|identity| Response::WhoAmI { identity }),
        option::of(user_directory()).prop_map(|directory| Response::GetUserDirectory { directory }),
        (any::<u64>(), any::<u32>()).prop_map(|(lease, term_ms)| Response::ClientLease {
            lease: stratus_types::LeaseId(lease),
            term_ms
        }),
        vec(any::<u32>(), 0..4)
            .prop_map(|remaining_ms| Response::CheckClientLeases { remaining_ms }),
        any::<u32>().prop_map(|replicas_to_partition| Response::BackupStartPartitioning {
            replicas_to_partition
        }),
        (any::<u32>(), value()).prop_map(|(checksum, data)| Response::BackupGetRecoveryData {
            certificate: ReplicaCertificate { segment_length: data.len() as u32, checksum },
            data,
        }),
        any::<[u64; 4]>().prop_map(
            |[segments_replayed, replica_bytes_read, objects_replayed, creation_segment]| {
                Response::RecoverTablets {
                    segments_replayed,
                    replica_bytes_read,
                    objects_replayed,
                    creation_segment: SegmentId(creation_segment),
                }
            }
        ),
    ]
}

fn backup_statistics() -> impl Strategy<Value = BackupServiceStatistics> {
    (any::<bool>(), any::<[u32; 6]>(), any::<[u64; 3]>(), option::of(name())).prop_map(
        |(fsync, counts, disk, storage_failure)| {
            let [replicas, replicas_open, buffers_in_use, buffer_count, frames_free, frame_count] =
                counts;
            let [disk_syncs, disk_write_jobs, disk_data_bytes_written] = disk;
            BackupServiceStatistics {
                durability: if fsync {
                    BackupDurability::Fsync
                } else {
                    BackupDurability::Buffered
                },
                replicas,
                replicas_open,
                buffers_in_use,
                buffer_count,
                frames_free,
                frame_count,
                disk_syncs,
                disk_write_jobs,
                disk_data_bytes_written,
                storage_failure,
            }
        },
    )
}
