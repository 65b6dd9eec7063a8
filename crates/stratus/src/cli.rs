//! Command-line parsing and the client commands.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use clap::{Args, Parser, Subcommand};
use stratus_client::{
    Client, ClientConfig, Error as ClientError, Expiry, RejectRules, TableId, Tier,
};
use stratus_env::Network;

/// Default coordinator address of a local cluster.
pub const DEFAULT_COORDINATOR: &str = "127.0.0.1:7400";

/// Stratus: a durable, distributed, in-memory key-value store.
#[derive(Debug, Parser)]
#[command(name = "stratus", version, about)]
pub struct Arguments {
    /// The coordinator to talk to ("host:port"); with standby coordinators, all of their
    /// addresses separated by commas (the active one is found).
    #[arg(long, global = true, env = "STRATUS_COORDINATOR", default_value = DEFAULT_COORDINATOR)]
    pub coordinator: String,
    /// How long a client command may take, retries included, in milliseconds.
    #[arg(long, global = true, default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// File holding the cluster's client password, for a cluster whose servers were started
    /// with --client-password-file (client commands, and `stratus resp`, which also asks its
    /// own clients for it with AUTH, and then serves the cluster's named users too: AUTH user
    /// password).
    #[arg(long, global = true, env = "STRATUS_PASSWORD_FILE")]
    pub password_file: Option<std::path::PathBuf>,
    /// Act as this named user (its password in --password-file), instead of the default user
    /// whose password is the client password.
    #[arg(long, global = true, env = "STRATUS_USER", requires = "password_file")]
    pub user: Option<String>,
    /// TLS: the CA to trust (clients), and the certificate and key (servers; clients that
    /// servers ask for one).
    #[command(flatten)]
    pub tls: crate::roles::TlsArguments,
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a local cluster in the foreground: a coordinator (or several, on an etcd it starts)
    /// and N storage servers on loopback.
    Up(crate::up::UpArguments),
    /// Run the coordinator.
    Coordinator(crate::roles::CoordinatorArguments),
    /// Run a storage server (master). Boxed: its flags make it several times the size of
    /// every other command.
    Server(Box<crate::roles::ServerArguments>),
    /// Run a Redis-protocol (RESP2/RESP3) gateway to the cluster.
    Resp(RespArguments),
    /// Create, drop or list tables.
    #[command(subcommand)]
    Table(TableCommand),
    /// Write an object. The value comes from the argument, from --file, or from stdin.
    Put(PutArguments),
    /// Read an object and print its value.
    Get(GetArguments),
    /// Remove an object.
    Del(KeyArguments),
    /// Add DELTA (default 1) to an 8-byte integer object and print the new value.
    Incr(IncrArguments),
    /// Make an object expire after a time to live (or never again, with --never).
    Expire(ExpireArguments),
    /// Print how long an object has left before it expires, or "no expiry".
    Ttl(KeyArguments),
    /// Print every object of a table, one "key<TAB>value" line each (non-printable bytes
    /// escaped).
    Scan(TableArgument),
    /// Show servers, backups, tables and tablets, and memory use, as tables (or as JSON).
    Status(StatusArguments),
    /// Operator decisions about crash recovery.
    #[command(subcommand)]
    Recovery(RecoveryCommand),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(stratus_bench::BenchCommand),
    /// Run one transaction read from stdin, one operation per line: `get TABLE KEY`,
    /// `set TABLE KEY VALUE`, `del TABLE KEY`, `incr TABLE KEY [DELTA]`. Prints what the gets
    /// and incrs saw and `committed`, or `aborted: <reason>` (exit status 1).
    Tx,
    /// Run a checked workload: concurrent recording clients on a small key set, then every
    /// key read back and the history checked for linearizability and lost writes. Exit status
    /// 0 pass, 2 violation, 3 inconclusive.
    Workload(crate::workload::WorkloadArguments),
    /// TLS files for a test bed.
    #[command(subcommand)]
    Tls(TlsCommand),
    /// Manage named users and their grants (a cluster administrator's commands).
    #[command(subcommand)]
    User(crate::users::UserCommand),
    /// Print who the cluster takes this client for, and what it may do.
    Whoami,
}

/// `stratus tls ...`
#[derive(Debug, Subcommand)]
pub enum TlsCommand {
    /// Write a local CA, one certificate for every coordinator and server (naming loopback
    /// and each --host) and one client certificate into --dir, as `stratus up --secure` does
    /// for its own cluster: for a cluster of containers or a few machines on a private network.
    /// Keeps the files already there. Production clusters use their own CA.
    LocalCa {
        /// Directory for ca.pem, ca-key.pem, node.pem, node-key.pem, client.pem, client-key.pem.
        #[arg(long)]
        dir: std::path::PathBuf,
        /// A host name or IP address the node certificate must name (repeat for each).
        #[arg(long = "host")]
        hosts: Vec<String>,
    },
}

/// `stratus resp`: database n is the table `<table-prefix>n`.
#[derive(Debug, Args)]
pub struct RespArguments {
    /// Address to accept Redis clients on (port 0: any free port).
    #[arg(long, default_value = "127.0.0.1:6380")]
    pub listen: String,
    /// Prefix of the table names: SELECT n uses the table `<prefix>n`.
    #[arg(long, default_value = "redis-db-")]
    pub table_prefix: String,
    /// Server span of the tables the gateway creates on first use.
    #[arg(long, default_value_t = 1)]
    pub table_span: u32,
    /// Number of databases SELECT accepts (0 ..= N - 1).
    #[arg(long, default_value_t = 16)]
    pub databases: u32,
    /// Longest argument (key or value) accepted, in bytes; longer ones are protocol errors.
    /// Set it to the servers' --value-bytes-max.
    #[arg(long, default_value_t = stratus_types::limits::VALUE_BYTES_MAX_DEFAULT)]
    pub value_bytes_max: usize,
    /// Worker threads serving connections (default: one per CPU).
    #[arg(long)]
    pub threads: Option<usize>,
}

/// `stratus table ...`
#[derive(Debug, Subcommand)]
pub enum TableCommand {
    /// Create a table spread over --span masters; prints its id.
    Create {
        /// Table name.
        name: String,
        /// Number of masters to spread it over.
        #[arg(long, default_value_t = 1)]
        span: u32,
        /// Where its objects live: memory, flash (the masters' flash logs, with only the index
        /// in memory, for tables larger than memory), or auto (the working set in memory, the
        /// rest on flash, moved by the masters). Fixed for the table's life.
        #[arg(long, default_value = "memory", value_parser = parse_tier)]
        tier: Tier,
    },
    /// Drop a table and all its objects.
    Drop {
        /// Table name.
        name: String,
    },
    /// List tables.
    List,
    /// Split the tablet holding SPLIT_HASH into two at that hash, on the same master (a hash
    /// that already starts a tablet changes nothing). `stratus status` shows the tablets.
    Split {
        /// Table name.
        name: String,
        /// First key hash of the second half: decimal, or hexadecimal with 0x.
        #[arg(value_parser = parse_key_hash)]
        split_hash: u64,
    },
    /// Move the tablet that starts at START_HASH to the master SERVER (as `stratus status`
    /// shows it) while clients keep running; split first to move part of a tablet.
    Migrate {
        /// Table name.
        name: String,
        /// First key hash of the tablet: decimal, or hexadecimal with 0x.
        #[arg(value_parser = parse_key_hash)]
        start_hash: u64,
        /// The master that is to serve it: its index (`2`, the server at that place now,
        /// restarts included) or its full id (`2.1`).
        #[arg(value_parser = parse_server_name)]
        server: ServerName,
    },
}

/// A key hash given as decimal or as 0x-prefixed hexadecimal (as `stratus status` prints
/// tablet bounds).
pub fn parse_key_hash(text: &str) -> Result<u64, String> {
    let digits = text.trim();
    let parsed = match digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16),
        None => digits.replace('_', "").parse::<u64>(),
    };
    parsed.map_err(|error| {
        format!("{text:?} is not a key hash in 0..=0xffffffffffffffff (decimal or 0x-hex): {error}")
    })
}

/// A storage tier by the name `stratus status` shows (`memory`, `flash`, `auto`).
pub fn parse_tier(text: &str) -> Result<Tier, String> {
    Tier::from_name(text.trim()).ok_or_else(|| {
        let names: Vec<&str> = Tier::ALL.iter().map(|tier| tier.name()).collect();
        format!("{text:?} is not a tier: give one of {}", names.join(", "))
    })
}

/// A server as an operator names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerName {
    /// `2`: whichever server holds that index (its place in the cluster, kept across
    /// restarts on the same data directory).
    Index(u32),
    /// `2.1`: exactly that id (index and generation).
    Id(stratus_types::ServerId),
}

/// Parses `--promotion-admission`.
pub fn parse_promotion_admission(text: &str) -> Result<stratus_store::PromotionAdmission, String> {
    match text {
        "second-read" => Ok(stratus_store::PromotionAdmission::SecondRead),
        "first-read" => Ok(stratus_store::PromotionAdmission::FirstRead),
        other => Err(format!("{other:?}: expected second-read or first-read")),
    }
}

/// A server given as its index (`2`) or its full id (`2.1`).
pub fn parse_server_name(text: &str) -> Result<ServerName, String> {
    let id = stratus_types::ServerId::parse(text.trim()).ok_or_else(|| {
        format!("{text:?} is not a server: give its index (2) or its id (2.1), as `stratus status` shows them")
    })?;
    Ok(if text.contains('.') { ServerName::Id(id) } else { ServerName::Index(id.index()) })
}

/// The id `name` stands for now: an index names the newest server at that index for which
/// `fits` holds (`what` says what was looked for, for the error).
async fn resolve_server(
    client: &Client,
    name: ServerName,
    fits: impl Fn(&stratus_client::ServerEntry) -> bool,
    what: &str,
) -> Result<stratus_types::ServerId, CommandError> {
    let index = match name {
        ServerName::Id(id) => return Ok(id),
        ServerName::Index(index) => index,
    };
    let servers = client.server_list().await?;
    let newest = servers
        .iter()
        .filter(|server| server.server_id.index() == index && fits(server))
        .max_by_key(|server| server.server_id.generation());
    newest.map(|server| server.server_id).ok_or_else(|| {
        CommandError::Value(format!("no {what} has index {index} (see `stratus status`)"))
    })
}

/// `stratus recovery ...`
#[derive(Debug, Subcommand)]
pub enum RecoveryCommand {
    /// Accept that a crashed master's data is lost: its recovery is impossible (it ran without
    /// replicas, or no backup holds its log; `stratus status` says so), and its tablets are
    /// handed to other masters empty. Every object it held is gone for good.
    AcceptLoss {
        /// The crashed master (as `stratus status` shows it): its full id (`2.1`), or its
        /// index (`2`) for the newest crashed server at that place.
        #[arg(value_parser = parse_server_name)]
        server: ServerName,
    },
}

/// A table name.
#[derive(Debug, Args)]
pub struct TableArgument {
    /// Table name.
    pub table: String,
}

/// A table and a key.
#[derive(Debug, Args)]
pub struct KeyArguments {
    /// Table name.
    pub table: String,
    /// Key (UTF-8 text).
    pub key: String,
}

/// `stratus put`.
#[derive(Debug, Args)]
pub struct PutArguments {
    /// Table name.
    pub table: String,
    /// Key.
    pub key: String,
    /// Value; omit it (or give "-") to read the value from stdin.
    pub value: Option<String>,
    /// Read the value from this file (binary-safe).
    #[arg(long, conflicts_with = "value")]
    pub file: Option<PathBuf>,
    /// Expire the object after this time to live (`90`, `90s`, `500ms`, `15m`, `2h`, `1d`),
    /// counted by its master's clock from when it applies the write. Without it the object
    /// does not expire (an expiry it had is cleared).
    #[arg(long, value_parser = parse_duration)]
    pub ttl: Option<Duration>,
}

/// `stratus expire`.
#[derive(Debug, Args)]
pub struct ExpireArguments {
    /// Table name.
    pub table: String,
    /// Key.
    pub key: String,
    /// Time to live from now (`90`, `90s`, `500ms`, `15m`, `2h`, `1d`).
    #[arg(value_parser = parse_duration, required_unless_present = "never")]
    pub ttl: Option<Duration>,
    /// Remove the object's expiry instead: it lives until removed.
    #[arg(long, conflicts_with = "ttl")]
    pub never: bool,
}

/// A duration as a number with an optional unit: ms, s (the default), m, h or d.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let digits_end = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    let number: u64 =
        number.parse().map_err(|_| format!("{text:?} is not a duration such as 90s or 500ms"))?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "" | "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(format!("{text:?}: the unit is ms, s, m, h or d")),
    };
    number
        .checked_mul(millis_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{text:?} is too long a duration"))
}

/// `stratus get`.
#[derive(Debug, Args)]
pub struct GetArguments {
    /// Table name.
    pub table: String,
    /// Key.
    pub key: String,
    /// Print the exact value bytes without a trailing newline.
    #[arg(long)]
    pub raw: bool,
    /// Write the exact value bytes to this file instead of stdout.
    #[arg(long, conflicts_with = "int")]
    pub output: Option<PathBuf>,
    /// Print the value as the signed integer `incr` keeps (8 bytes, little-endian), in
    /// decimal; a value of any other length is an error.
    #[arg(long, conflicts_with = "raw")]
    pub int: bool,
}

/// `stratus status`.
#[derive(Debug, Args)]
pub struct StatusArguments {
    /// Print one JSON document with every figure the servers report, for scripts.
    #[arg(long)]
    pub json: bool,
}

/// `stratus incr`.
#[derive(Debug, Args)]
pub struct IncrArguments {
    /// Table name.
    pub table: String,
    /// Key.
    pub key: String,
    /// Amount to add.
    #[arg(default_value_t = 1, allow_hyphen_values = true)]
    pub delta: i64,
}

impl Arguments {
    /// Log filter when STRATUS_LOG is not set: servers log their progress, client commands
    /// stay quiet.
    pub fn default_log_filter(&self) -> &'static str {
        match self.command {
            Command::Up(_) | Command::Coordinator(_) | Command::Server(_) | Command::Resp(_) => {
                "info"
            }
            _ => "warn",
        }
    }
}

/// Runs the parsed command and returns the process's exit status.
pub fn main(arguments: Arguments) -> std::process::ExitCode {
    match arguments.command {
        // The workload's exit status is its verdict (pass, violation, inconclusive).
        Command::Workload(workload) => match client_config(&ClientFlags {
            coordinator: &arguments.coordinator,
            timeout_ms: arguments.timeout_ms,
            password_file: arguments.password_file.as_deref(),
            user: arguments.user.as_deref(),
            tls: &arguments.tls,
        }) {
            Ok(base) => crate::workload::run(workload, base),
            Err(message) => {
                eprintln!("stratus: {message}");
                std::process::ExitCode::FAILURE
            }
        },
        command => match run(Arguments { command, ..arguments }) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(message) => {
                eprintln!("stratus: {message}");
                std::process::ExitCode::FAILURE
            }
        },
    }
}

/// Runs the parsed command; `Err` is the one-line message printed before exiting non-zero.
pub fn run(arguments: Arguments) -> Result<(), String> {
    if arguments.password_file.is_some() && matches!(arguments.command, Command::Bench(_)) {
        // Benchmarks start their own clusters, or drive clients of their own: none proves a
        // password.
        return Err("--password-file is not supported by bench yet".to_string());
    }
    match arguments.command {
        Command::Up(up) => crate::up::run(up, &arguments.coordinator, &arguments.tls),
        Command::Coordinator(role) => crate::roles::run_coordinator(role, &arguments.tls),
        Command::Server(role) => {
            crate::roles::run_server(*role, &arguments.tls, &arguments.coordinator)
        }
        Command::Bench(bench) => stratus_bench::run(bench, &arguments.coordinator),
        Command::Tls(TlsCommand::LocalCa { dir, hosts }) => {
            let (files, created) = stratus_tls::local_authority::ensure(&dir, &hosts)
                .map_err(|error| format!("local CA: {error}"))?;
            let verb = if created { "wrote" } else { "kept" };
            println!(
                "{verb} a local CA in {}: clients trust {}, every process shows {} (key {})",
                dir.display(),
                files.ca_certificate.display(),
                files.node_certificate.display(),
                files.node_key.display()
            );
            Ok(())
        }
        Command::Resp(resp) => {
            let password = read_password(arguments.password_file.as_deref())?;
            run_resp(resp, &arguments.coordinator, arguments.timeout_ms, password, &arguments.tls)
        }
        command => {
            let flags = ClientFlags {
                coordinator: &arguments.coordinator,
                timeout_ms: arguments.timeout_ms,
                password_file: arguments.password_file.as_deref(),
                user: arguments.user.as_deref(),
                tls: &arguments.tls,
            };
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|error| error.to_string())?;
            let config = client_config(&flags)?;
            runtime.block_on(async move {
                let client = Client::new(config);
                run_client_command(&client, command).await.map_err(|error| error.to_string())
            })
        }
    }
}

/// The global flags a client command reads.
struct ClientFlags<'a> {
    coordinator: &'a str,
    timeout_ms: u64,
    password_file: Option<&'a std::path::Path>,
    user: Option<&'a str>,
    tls: &'a crate::roles::TlsArguments,
}

/// The settings of a client of the cluster the flags name: its coordinator, the command
/// timeout, and the credentials (the client password, or a named user's) and TLS it needs, if
/// any.
fn client_config(arguments: &ClientFlags<'_>) -> Result<ClientConfig, String> {
    let mut config = ClientConfig::new(arguments.coordinator.to_string());
    config.operation_timeout = Duration::from_millis(arguments.timeout_ms);
    if let Some(password) = read_password(arguments.password_file)? {
        config = match arguments.user {
            Some(user) => {
                config.with_user(user, &password).map_err(|error| format!("--user: {error}"))?
            }
            None => config.with_password(&password).map_err(|error| error.to_string())?,
        };
    }
    config.tls = arguments.tls.client()?;
    Ok(config)
}

/// The client password in `path`, if one was given (surrounding whitespace removed).
fn read_password(path: Option<&std::path::Path>) -> Result<Option<Vec<u8>>, String> {
    let Some(path) = path else { return Ok(None) };
    stratus_rpc::membership::read_secret_file(path)
        .map(Some)
        .map_err(|error| format!("--password-file: {error}"))
}

/// Runs the RESP gateway until SIGINT or SIGTERM; with `password`, it proves it to the cluster
/// and asks its own clients for it (AUTH), and serves named users (AUTH user password, each
/// session's requests sent as its user; docs/design/resp-acl.md); with a TLS certificate, its clients speak TLS to it,
/// and with a TLS CA, it speaks TLS to the cluster.
fn run_resp(
    resp: RespArguments,
    coordinator: &str,
    timeout_ms: u64,
    password: Option<Vec<u8>>,
    tls: &crate::roles::TlsArguments,
) -> Result<(), String> {
    let listener_tls = tls.listener()?;
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = resp.threads {
        runtime.worker_threads(threads.max(1));
    }
    let runtime = runtime.enable_all().build().map_err(|error| error.to_string())?;
    let mut config = ClientConfig::new(coordinator.to_string());
    config.operation_timeout = Duration::from_millis(timeout_ms);
    if let Some(password) = &password {
        config = config.with_password(password).map_err(|error| error.to_string())?;
    }
    config.tls = tls.client()?;
    // Named users (AUTH user password) exist on clusters that require the client password;
    // their sessions go out as them (the same coordinator, timeout and TLS).
    let user_clients = password.as_ref().map(|_| {
        let mut user_config = ClientConfig::new(coordinator.to_string());
        user_config.operation_timeout = config.operation_timeout;
        user_config.tls = config.tls.clone();
        crate::roles::user_clients(user_config)
    });
    let gateway_config = stratus_resp::GatewayConfig {
        password: password.map(stratus_resp::RespPassword),
        user_clients,
        table_prefix: resp.table_prefix,
        table_span: resp.table_span,
        databases: resp.databases,
        limits: stratus_resp::RequestLimits {
            argument_bytes_max: resp.value_bytes_max,
            ..stratus_resp::RequestLimits::default()
        },
        ..stratus_resp::GatewayConfig::default()
    };
    runtime.block_on(async move {
        let environment = stratus_env::Environment::system();
        if let Some(tls) = &listener_tls {
            tokio::spawn(tls.clone().watch());
        }
        if let Some(tls) = &config.tls {
            tokio::spawn(tls.clone().watch());
        }
        let listening =
            stratus_tls::TlsNetwork::new(environment.network.clone(), listener_tls.clone(), None);
        let listener = listening
            .bind(&resp.listen)
            .await
            .map_err(|error| format!("listen on {}: {error}", resp.listen))?;
        let with_tls = if listener_tls.is_some() { " (TLS)" } else { "" };
        println!("resp gateway listening on {}{with_tls}", listener.local_address());
        let client = Client::with_environment(config, environment);
        let gateway = std::sync::Arc::new(stratus_resp::Gateway::new(client, gateway_config));
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .map_err(|error| error.to_string())?;
        tokio::select! {
            () = stratus_resp::serve(gateway, listener) => {}
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        Ok(())
    })
}

/// Why a client command failed: the cluster's answer, or a local file (or stdin, stdout) that
/// could not be used. Printed as the one line before a non-zero exit.
#[derive(Debug)]
enum CommandError {
    Cluster(ClientError),
    Local {
        what: String,
        error: std::io::Error,
    },
    /// The value is not what the command was asked to print it as.
    Value(String),
}

impl From<ClientError> for CommandError {
    fn from(error: ClientError) -> CommandError {
        CommandError::Cluster(error)
    }
}

impl std::fmt::Display for CommandError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CommandError::Cluster(error) => write!(f, "{error}"),
            CommandError::Local { what, error } => write!(f, "{what}: {error}"),
            CommandError::Value(message) => f.write_str(message),
        }
    }
}

async fn table_id(client: &Client, name: &str) -> Result<TableId, ClientError> {
    client.get_table_id(name).await
}

async fn run_client_command(client: &Client, command: Command) -> Result<(), CommandError> {
    let mut stdout = std::io::stdout().lock();
    match command {
        Command::Table(TableCommand::Create { name, span, tier }) => {
            let id = client.create_table_with_tier(&name, span, tier).await?;
            let _ = writeln!(stdout, "{id}");
        }
        Command::Table(TableCommand::Drop { name }) => {
            client.drop_table(&name).await?;
            let _ = writeln!(stdout, "dropped {name}");
        }
        Command::User(command) => {
            crate::users::run(client, command).await.map_err(CommandError::Value)?
        }
        Command::Whoami => crate::users::who_am_i(client).await.map_err(CommandError::Value)?,
        Command::Recovery(RecoveryCommand::AcceptLoss { server }) => {
            let awaits_recovery =
                |server: &stratus_client::ServerEntry| server.status.awaits_recovery();
            let server_id =
                resolve_server(client, server, awaits_recovery, "crashed server").await?;
            client.recovery_accept_loss(server_id).await?;
            let _ = writeln!(
                stdout,
                "loss accepted: the tablets of server {server_id} are handed over empty"
            );
        }
        Command::Table(TableCommand::Split { name, split_hash }) => {
            client.split_tablet(&name, split_hash).await?;
            let _ = writeln!(stdout, "split {name} at {split_hash:#018x}");
        }
        Command::Table(TableCommand::Migrate { name, start_hash, server }) => {
            let serving = |server: &stratus_client::ServerEntry| {
                server.status == stratus_client::ServerStatus::Up && server.services.has_master()
            };
            let target = resolve_server(client, server, serving, "master that is up").await?;
            client.migrate_tablet(&name, start_hash, target).await?;
            let _ =
                writeln!(stdout, "migrated {name} tablet {start_hash:#018x} to server {target}");
        }
        Command::Tx => {
            let lines =
                crate::tx::read_lines(std::io::stdin().lock()).map_err(CommandError::Value)?;
            drop(stdout);
            crate::tx::run(client, &lines).await.map_err(CommandError::Value)?;
            return Ok(());
        }
        Command::Table(TableCommand::List) => {
            for table in client.list_tables().await? {
                let _ = writeln!(
                    stdout,
                    "{}\tid={}\ttablets={}\ttier={}",
                    table.name, table.table_id, table.tablet_count, table.tier
                );
            }
        }
        Command::Put(put) => {
            let value = read_value(&put)?;
            let table = table_id(client, &put.table).await?;
            let expiry = put.ttl.map_or(Expiry::Never, |ttl| Expiry::AfterMillis(millis_of(ttl)));
            let key = put.key.as_bytes();
            let version =
                client.write_expiring(table, key, value, RejectRules::NONE, expiry).await?;
            let _ = writeln!(stdout, "ok version={version}");
        }
        Command::Get(get) => {
            let table = table_id(client, &get.table).await?;
            let (value, _version) = client.read(table, get.key.as_bytes()).await?;
            if let Some(path) = get.output {
                std::fs::write(&path, &value).map_err(|error| CommandError::Local {
                    what: format!("cannot write {}", path.display()),
                    error,
                })?;
            } else if get.int {
                let _ = writeln!(stdout, "{}", integer_value(&value)?);
            } else {
                let _ = stdout.write_all(&value);
                if !get.raw {
                    let _ = stdout.write_all(b"\n");
                }
            }
        }
        Command::Del(del) => {
            let table = table_id(client, &del.table).await?;
            let version = client.remove(table, del.key.as_bytes()).await?;
            let _ = writeln!(stdout, "removed version={version}");
        }
        Command::Incr(incr) => {
            let table = table_id(client, &incr.table).await?;
            let (value, _version) =
                client.increment(table, incr.key.as_bytes(), incr.delta).await?;
            let _ = writeln!(stdout, "{value}");
        }
        Command::Expire(expire) => {
            let table = table_id(client, &expire.table).await?;
            let expiry =
                expire.ttl.map_or(Expiry::Never, |ttl| Expiry::AfterMillis(millis_of(ttl)));
            let key = expire.key.as_bytes();
            let version = client.set_expiry(table, key, expiry, RejectRules::NONE).await?;
            let _ = writeln!(stdout, "ok version={version}");
        }
        Command::Ttl(ttl) => {
            let table = table_id(client, &ttl.table).await?;
            let object = client.read_object(table, ttl.key.as_bytes(), RejectRules::NONE).await?;
            let _ = match object.expires_in {
                Some(left) => writeln!(stdout, "{:.3}s", left.as_secs_f64()),
                None => writeln!(stdout, "no expiry"),
            };
        }
        Command::Scan(scan) => {
            let table = table_id(client, &scan.table).await?;
            let mut enumeration = client.enumerate(table);
            while let Some(batch) = enumeration.next_batch().await? {
                for object in batch {
                    let _ = writeln!(
                        stdout,
                        "{}\t{}",
                        object.key.escape_ascii(),
                        object.value.escape_ascii()
                    );
                }
            }
        }
        Command::Status(arguments) => {
            let status = crate::status::ClusterStatus::gather(client).await?;
            let printed = if arguments.json {
                writeln!(stdout, "{:#}", status.to_json())
            } else {
                status.print_text(&mut stdout)
            };
            match printed {
                // A reader that stopped early (`| head`) wanted no more: not a failure.
                Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => {}
                printed => printed.map_err(|error| CommandError::Local {
                    what: "cannot write stdout".to_string(),
                    error,
                })?,
            }
        }
        Command::Up(_)
        | Command::Coordinator(_)
        | Command::Server(_)
        | Command::Resp(_)
        | Command::Bench(_)
        | Command::Tls(_)
        | Command::Workload(_) => {
            unreachable!("roles are dispatched before the client starts")
        }
    }
    Ok(())
}

fn read_value(put: &PutArguments) -> Result<Bytes, CommandError> {
    if let Some(path) = &put.file {
        return std::fs::read(path).map(Bytes::from).map_err(|error| CommandError::Local {
            what: format!("cannot read {}", path.display()),
            error,
        });
    }
    match put.value.as_deref() {
        Some("-") | None => {
            let mut value = Vec::new();
            std::io::stdin().read_to_end(&mut value).map_err(|error| CommandError::Local {
                what: "cannot read stdin".to_string(),
                error,
            })?;
            Ok(Bytes::from(value))
        }
        Some(text) => Ok(Bytes::copy_from_slice(text.as_bytes())),
    }
}

/// Whole milliseconds of `duration`, saturating.
fn millis_of(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A value as the integer `incr` keeps: 8 bytes, little-endian, signed.
fn integer_value(value: &[u8]) -> Result<i64, CommandError> {
    let bytes: [u8; 8] = value.try_into().map_err(|_| {
        CommandError::Value(format!(
            "the value is {} bytes, not an integer of 8 (as `incr` keeps them)",
            value.len()
        ))
    })?;
    Ok(i64::from_le_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::parse_key_hash;

    #[test]
    fn key_hashes_parse_as_decimal_or_hex() {
        assert_eq!(parse_key_hash("0"), Ok(0));
        assert_eq!(parse_key_hash("9223372036854775808"), Ok(1 << 63));
        assert_eq!(parse_key_hash("0x8000000000000000"), Ok(1 << 63));
        assert_eq!(parse_key_hash("0XFFFFFFFFFFFFFFFF"), Ok(u64::MAX));
        assert_eq!(parse_key_hash("0x8000_0000_0000_0000"), Ok(1 << 63));
        for bad in ["", "0x", "-1", "18446744073709551616", "0x1ffffffffffffffff", "12ab", "x1"] {
            assert!(parse_key_hash(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn durations_take_a_unit_and_default_to_seconds() {
        use super::parse_duration;
        use std::time::Duration;
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7_200)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        for bad in ["", "s", "1.5s", "-1", "10w", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn promotion_admission_parses_its_two_names() {
        use super::parse_promotion_admission;
        use stratus_store::PromotionAdmission;
        assert_eq!(parse_promotion_admission("second-read"), Ok(PromotionAdmission::SecondRead));
        assert_eq!(parse_promotion_admission("first-read"), Ok(PromotionAdmission::FirstRead));
        for bad in ["", "second", "SECOND-READ", "always"] {
            assert!(parse_promotion_admission(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn servers_are_named_by_index_or_by_full_id() {
        use super::{parse_server_name, ServerName};
        use stratus_types::ServerId;
        assert_eq!(parse_server_name("2"), Ok(ServerName::Index(2)));
        assert_eq!(parse_server_name("2.0"), Ok(ServerName::Id(ServerId(2))));
        assert_eq!(parse_server_name("2.1"), Ok(ServerName::Id(ServerId::new(2, 1))));
        for bad in ["", "0", "two", "2.", "-2"] {
            assert!(parse_server_name(bad).is_err(), "{bad:?} must be refused");
        }
    }
}
