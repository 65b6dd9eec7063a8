//! A storage server's backup killed with SIGKILL and started again on the same `--backup-dir`
//! reports the replicas it had on disk, byte for byte: closed ones in buffered mode, and also
//! the open head's replica (up to its last acknowledged write) in fsync mode.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{server_arguments, Process, TestCluster};
use stratus_env::TcpNetwork;
use stratus_rpc::{ChannelPool, RpcConfig};
use stratus_types::ServerId;
use stratus_wire::{ReplicaEntry, Request, Response, ResponseBody, Status};

async fn replicas(pool: &ChannelPool, address: &str) -> Vec<(ReplicaEntry, Bytes)> {
    let request = Request::BackupListReplicas { master_id: ServerId(0) };
    let listed = match pool.call(address, &request).await.unwrap() {
        (Status::Ok, ResponseBody::Operation(Response::BackupListReplicas { replicas })) => {
            replicas
        }
        other => panic!("listing replicas on {address}: {other:?}"),
    };
    let mut all = Vec::new();
    for entry in listed {
        let request =
            Request::BackupReadReplica { master_id: entry.master_id, segment_id: entry.segment_id };
        match pool.call(address, &request).await.unwrap() {
            (Status::Ok, ResponseBody::Operation(Response::BackupReadReplica { data, .. })) => {
                all.push((entry, data))
            }
            other => panic!("reading a replica on {address}: {other:?}"),
        }
    }
    all
}

fn start_server(
    cluster: &TestCluster,
    backup_directory: &std::path::Path,
    durability: &str,
) -> Process {
    let mut arguments = server_arguments(&cluster.coordinator_address, 1, backup_directory);
    arguments.extend(["--durability".to_string(), durability.to_string()]);
    let mut server = Process::start(&arguments);
    let line = server.wait_for_line("listening on", Duration::from_secs(30));
    server.address = line.split_whitespace().last().map(str::to_string);
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_backup_reports_its_replicas_again() {
    for durability in ["buffered", "fsync"] {
        let cluster = TestCluster::start_with_replicas(0, 1);
        let master_directory = cluster.directory.path().join("master-backup");
        let backup_directory = cluster.directory.path().join("backup");
        // The first server becomes the table's master; the second is its only backup.
        let master = start_server(&cluster, &master_directory, durability);
        let client = cluster.client();
        let table = client.create_table("restart", 1).await.unwrap();
        let mut backup = start_server(&cluster, &backup_directory, durability);
        let backup_address = backup.address.clone().expect("address");
        // About 3 MiB: several 1 MiB segments close on the backup.
        for index in 0..300u32 {
            let value = vec![(index % 251) as u8; 10_000];
            client.write(table, format!("key-{index}").as_bytes(), &value).await.unwrap();
        }
        let pool = ChannelPool::new(Arc::new(TcpNetwork), RpcConfig::default());
        let before = replicas(&pool, &backup_address).await;
        assert!(before.iter().filter(|(entry, _)| entry.closed).count() >= 2, "{durability}");

        backup.signal(libc::SIGKILL);
        assert!(backup.wait_exit(Duration::from_secs(10)).is_some());
        let restarted = start_server(&cluster, &backup_directory, durability);
        let address = restarted.address.clone().expect("address");
        let after = replicas(&pool, &address).await;
        for (entry, data) in &before {
            if !entry.closed && durability == "buffered" {
                continue; // in RAM only, as buffered mode promises
            }
            let found = after
                .iter()
                .find(|(other, _)| other.segment_id == entry.segment_id)
                .unwrap_or_else(|| panic!("{durability}: segment {} lost", entry.segment_id));
            // The open head may have grown between listing and killing; what was listed is a
            // prefix of what was found.
            assert!(found.0.certificate.segment_length >= entry.certificate.segment_length);
            assert_eq!(
                &found.1[..data.len()],
                &data[..],
                "{durability}: segment {}",
                entry.segment_id
            );
        }
        drop(master);
    }
}
