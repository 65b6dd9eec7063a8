//! The production roles: coordinator and storage server.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use stratus_coordinator::Coordinator;
use stratus_env::Environment;
use stratus_master::{Master, MasterConfig};
use stratus_meta::FileMetaStore;
use stratus_rpc::{serve, Backoff, ChannelPool, RpcConfig};
use stratus_store::StoreConfig;
use stratus_wire::{Request, Response, ResponseBody, ServiceMask, Status};

/// `stratus coordinator`.
#[derive(Debug, Args)]
pub struct CoordinatorArguments {
    /// Address to listen on.
    #[arg(long, default_value = crate::cli::DEFAULT_COORDINATOR)]
    pub listen: String,
    /// Directory of the coordinator's durable state.
    #[arg(long)]
    pub dir: PathBuf,
}

/// `stratus server`.
#[derive(Debug, Args)]
pub struct ServerArguments {
    /// Address to listen on; port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: String,
    /// Address to announce to the coordinator (default: the bound address).
    #[arg(long)]
    pub advertise: Option<String>,
    /// Memory for the log, in MiB.
    #[arg(long, default_value_t = 256)]
    pub log_mib: u64,
    /// Segment size, in MiB.
    #[arg(long, default_value_t = 8)]
    pub segment_mib: u32,
    /// Largest value accepted, in bytes (at most segment / 8).
    #[arg(long)]
    pub value_bytes_max: Option<u32>,
    /// How long to keep trying to enlist with the coordinator, in seconds.
    #[arg(long, default_value_t = 60)]
    pub enlist_timeout_seconds: u64,
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|error| error.to_string())
}

/// Waits for SIGINT or SIGTERM.
async fn termination() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = match signal(SignalKind::terminate()) {
        Ok(stream) => stream,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}

/// Runs the coordinator until SIGINT/SIGTERM.
pub fn run_coordinator(arguments: CoordinatorArguments) -> Result<(), String> {
    std::fs::create_dir_all(&arguments.dir)
        .map_err(|error| format!("{}: {error}", arguments.dir.display()))?;
    let (store, report) =
        FileMetaStore::open(&arguments.dir).map_err(|error| format!("metadata store: {error}"))?;
    if report.torn_tail_bytes_discarded > 0 {
        tracing::warn!(
            bytes = report.torn_tail_bytes_discarded,
            "discarded a torn, unacknowledged tail of the metadata log"
        );
    }
    let environment = Environment::system();
    let coordinator = Coordinator::open(Arc::new(store), environment.clone())
        .map_err(|error| error.to_string())?;
    runtime()?.block_on(async move {
        let listener = environment.network.bind(&arguments.listen).await.map_err(|error| format!("listen on {}: {error}", arguments.listen))?;
        let address = listener.local_address();
        tracing::info!(%address, "coordinator listening");
        println!("coordinator listening on {address}");
        let background = coordinator.clone();
        tokio::spawn(async move { background.verify_servers_and_redeliver().await });
        tokio::select! {
            result = serve(listener, Arc::new(coordinator)) => result.map_err(|error| error.to_string()),
            _ = termination() => {
                tracing::info!("coordinator stopping");
                Ok(())
            }
        }
    })
}

/// Runs a storage server until SIGINT/SIGTERM.
pub fn run_server(arguments: ServerArguments, coordinator: &str) -> Result<(), String> {
    let mut store = StoreConfig::with_log_bytes(arguments.log_mib << 20);
    store.segment_bytes = arguments.segment_mib << 20;
    // Without an explicit limit, values may be as large as the segment size allows (an eighth
    // of a segment, the cleaner's packing rule), up to the default.
    store.value_bytes_max = match arguments.value_bytes_max {
        Some(value_bytes_max) => value_bytes_max,
        None => store.value_bytes_max.min(store.segment_bytes / 8),
    };
    store.validate().map_err(|error| format!("invalid memory configuration: {error}"))?;
    let environment = Environment::system();
    let coordinator = coordinator.to_string();
    runtime()?.block_on(async move {
        let listener = environment
            .network
            .bind(&arguments.listen)
            .await
            .map_err(|error| format!("listen on {}: {error}", arguments.listen))?;
        let address = arguments.advertise.clone().unwrap_or_else(|| listener.local_address());
        let deadline = Duration::from_secs(arguments.enlist_timeout_seconds);
        let server_id = enlist(&environment, &coordinator, &address, deadline).await?;
        let master =
            Master::new(server_id, MasterConfig { store }, environment.wall_clock.clone())?;
        tracing::info!(%server_id, %address, log_mib = arguments.log_mib, "server serving");
        println!("server {server_id} listening on {address}");
        tokio::select! {
            result = serve(listener, Arc::new(master)) => result.map_err(|error| error.to_string()),
            _ = termination() => {
                tracing::info!("server stopping");
                Ok(())
            }
        }
    })
}

/// Joins the cluster, retrying while the coordinator is not reachable yet.
async fn enlist(
    environment: &Environment,
    coordinator: &str,
    address: &str,
    patience: Duration,
) -> Result<stratus_types::ServerId, String> {
    let pool = ChannelPool::new(environment.network.clone(), RpcConfig::default());
    let request = Request::EnlistServer {
        address: address.to_string(),
        services: ServiceMask(ServiceMask::MASTER),
    };
    let deadline = tokio::time::Instant::now() + patience;
    let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_millis(500));
    loop {
        match pool.call(coordinator, &request).await {
            Ok((Status::Ok, ResponseBody::Operation(Response::EnlistServer { server_id }))) => {
                return Ok(server_id)
            }
            Ok((status, body)) => {
                return Err(format!("coordinator refused enlistment: {status} {body:?}"))
            }
            Err(error) => {
                pool.forget(coordinator);
                if tokio::time::Instant::now() >= deadline {
                    return Err(format!("cannot reach the coordinator at {coordinator}: {error}"));
                }
            }
        }
        tokio::time::sleep(backoff.next_delay(&*environment.entropy)).await;
    }
}
