//! TLS over real loopback sockets: a round trip, a client that does not trust the server, a
//! listener that requires client certificates, a certificate reloaded without a restart, and
//! a plain-text client that fails its handshake without stopping the listener.

use std::path::Path;
use std::sync::Arc;

use stratus_env::{Connection, Network, TcpNetwork};
use stratus_tls::local_authority::{ensure, LocalAuthorityFiles};
use stratus_tls::{
    ClientCertificates, ClientTls, ClientTlsFiles, ServerTls, ServerTlsFiles, TlsNetwork,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn server_files(authority: &LocalAuthorityFiles, clients: ClientCertificates) -> ServerTlsFiles {
    ServerTlsFiles {
        certificate: authority.node_certificate.clone(),
        private_key: authority.node_key.clone(),
        client_certificates: clients,
    }
}

fn client(authority: &LocalAuthorityFiles, with_certificate: bool) -> ClientTls {
    let certificate_and_key = with_certificate
        .then(|| (authority.client_certificate.clone(), authority.client_key.clone()));
    ClientTls::load(&ClientTlsFiles { ca: authority.ca_certificate.clone(), certificate_and_key })
        .expect("client TLS")
}

/// Binds a TLS echo server: every connection gets back what it sends, line by line.
async fn echo_server(tls: Arc<ServerTls>) -> String {
    let network = TlsNetwork::new(Arc::new(TcpNetwork), Some(tls), None);
    let mut listener = network.bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_address();
    tokio::spawn(async move {
        while let Ok(connection) = listener.accept().await {
            tokio::spawn(async move {
                let Connection { mut reader, mut writer, .. } = connection;
                let mut buffer = [0u8; 1024];
                while let Ok(read) = reader.read(&mut buffer).await {
                    if read == 0 || writer.write_all(&buffer[..read]).await.is_err() {
                        break;
                    }
                    let _ = writer.flush().await;
                }
            });
        }
    });
    address
}

async fn round_trip(client: &ClientTls, address: &str) -> std::io::Result<Vec<u8>> {
    let network = TlsNetwork::new(Arc::new(TcpNetwork), None, Some(client.clone()));
    let mut connection = network.connect(address).await?;
    connection.writer.write_all(b"hello over tls").await?;
    connection.writer.flush().await?;
    let mut answer = vec![0u8; 14];
    connection.reader.read_exact(&mut answer).await?;
    Ok(answer)
}

/// Waits (at most 10 s) until `tls` counted `failed` failed handshakes: the server side counts
/// a failure after its alert is sent, so the client may see the refusal first.
async fn wait_for_failed_handshakes(tls: &ServerTls, failed: u64) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while tls.handshakes_failed() < failed && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    assert_eq!(tls.handshakes_failed(), failed);
}

/// A listener's TLS loaded from its own copy (in `directory`/live) of `authority`'s node
/// certificate and key, and the copies' paths, for a test to replace them.
fn listener_on_a_copy_of(
    directory: &Path,
    authority: &LocalAuthorityFiles,
) -> (Arc<ServerTls>, std::path::PathBuf, std::path::PathBuf) {
    let live = directory.join("live");
    std::fs::create_dir_all(&live).unwrap();
    let (certificate, key) = (live.join("server.pem"), live.join("server-key.pem"));
    std::fs::copy(&authority.node_certificate, &certificate).unwrap();
    std::fs::copy(&authority.node_key, &key).unwrap();
    let files = ServerTlsFiles {
        certificate: certificate.clone(),
        private_key: key.clone(),
        client_certificates: ClientCertificates::NotAsked,
    };
    (ServerTls::load(files).unwrap(), certificate, key)
}

fn authority(directory: &Path) -> LocalAuthorityFiles {
    ensure(directory, &[]).expect("local authority").0
}

#[tokio::test]
async fn a_client_that_trusts_the_ca_talks_and_one_that_does_not_is_refused() {
    let directory = tempfile::tempdir().unwrap();
    let ours = authority(&directory.path().join("ours"));
    let theirs = authority(&directory.path().join("theirs"));
    let tls = ServerTls::load(server_files(&ours, ClientCertificates::NotAsked)).unwrap();
    let address = echo_server(tls.clone()).await;

    assert_eq!(round_trip(&client(&ours, false), &address).await.unwrap(), b"hello over tls");
    let refused = round_trip(&client(&theirs, false), &address).await.unwrap_err();
    assert!(refused.to_string().contains("TLS handshake"), "{refused}");
    // The listener goes on serving after a failed handshake.
    assert_eq!(round_trip(&client(&ours, false), &address).await.unwrap(), b"hello over tls");
    wait_for_failed_handshakes(&tls, 1).await;
}

#[tokio::test]
async fn required_client_certificates_refuse_a_client_without_one() {
    let directory = tempfile::tempdir().unwrap();
    let ours = authority(directory.path());
    let required = ClientCertificates::Required(ours.ca_certificate.clone());
    let tls = ServerTls::load(server_files(&ours, required)).unwrap();
    let address = echo_server(tls.clone()).await;

    assert_eq!(round_trip(&client(&ours, true), &address).await.unwrap(), b"hello over tls");
    // TLS 1.3: the client finishes its side before the server checks its certificate, so the
    // refusal shows when the client reads.
    assert!(round_trip(&client(&ours, false), &address).await.is_err());
    wait_for_failed_handshakes(&tls, 1).await;
}

#[tokio::test]
async fn optional_client_certificates_admit_both() {
    let directory = tempfile::tempdir().unwrap();
    let ours = authority(directory.path());
    let optional = ClientCertificates::Optional(ours.ca_certificate.clone());
    let tls = ServerTls::load(server_files(&ours, optional)).unwrap();
    let address = echo_server(tls).await;
    assert!(round_trip(&client(&ours, true), &address).await.is_ok());
    assert!(round_trip(&client(&ours, false), &address).await.is_ok());
}

#[tokio::test]
async fn a_replaced_certificate_is_used_without_a_restart() {
    let directory = tempfile::tempdir().unwrap();
    let old = authority(&directory.path().join("old"));
    let new = authority(&directory.path().join("new"));
    let (tls, certificate, key) = listener_on_a_copy_of(directory.path(), &old);
    let address = echo_server(tls.clone()).await;
    assert!(round_trip(&client(&old, false), &address).await.is_ok());
    assert!(!tls.reload_if_changed().unwrap(), "nothing changed yet");

    // A half-done replacement (the new certificate beside the old key) does not load: the old
    // certificate stays in use.
    std::fs::copy(&new.node_certificate, &certificate).unwrap();
    assert!(tls.reload_if_changed().is_err());
    assert!(round_trip(&client(&old, false), &address).await.is_ok());

    // Once the key follows, the next check loads both.
    std::fs::copy(&new.node_key, &key).unwrap();
    assert!(tls.reload_if_changed().unwrap());
    assert_eq!(tls.reloads(), 1);
    assert_eq!(tls.reloads_failed(), 1);
    assert!(round_trip(&client(&new, false), &address).await.is_ok());
    assert!(round_trip(&client(&old, false), &address).await.is_err());
}

#[tokio::test]
async fn a_plain_text_client_fails_its_handshake_and_the_listener_goes_on() {
    let directory = tempfile::tempdir().unwrap();
    let ours = authority(directory.path());
    let tls = ServerTls::load(server_files(&ours, ClientCertificates::NotAsked)).unwrap();
    let address = echo_server(tls.clone()).await;
    let mut plain = TcpNetwork.connect(&address).await.unwrap();
    plain.writer.write_all(b"*1\r\n$4\r\nPING\r\n").await.unwrap();
    let mut answer = Vec::new();
    // The server answers with a TLS alert or closes: never with the bytes echoed.
    let _ = plain.reader.read_to_end(&mut answer).await;
    assert!(!answer.starts_with(b"*1"));
    assert_eq!(round_trip(&client(&ours, false), &address).await.unwrap(), b"hello over tls");
    wait_for_failed_handshakes(&tls, 1).await;
}

#[test]
fn missing_and_wrong_files_are_named_in_the_error() {
    let directory = tempfile::tempdir().unwrap();
    let ours = authority(directory.path());
    let missing = ServerTlsFiles {
        certificate: directory.path().join("nope.pem"),
        private_key: ours.node_key.clone(),
        client_certificates: ClientCertificates::NotAsked,
    };
    let error = ServerTls::load(missing).unwrap_err().to_string();
    assert!(error.contains("nope.pem"), "{error}");
    // A key that is not the certificate's.
    let mismatched = ServerTlsFiles {
        certificate: ours.node_certificate.clone(),
        private_key: ours.client_key.clone(),
        client_certificates: ClientCertificates::NotAsked,
    };
    assert!(ServerTls::load(mismatched).is_err());
    // A certificate file holding a key.
    let error =
        ClientTls::load(&ClientTlsFiles { ca: ours.ca_key.clone(), certificate_and_key: None })
            .unwrap_err()
            .to_string();
    assert!(error.contains("ca-key.pem"), "{error}");
}

#[test]
fn the_local_authority_is_written_once_and_its_keys_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let directory = tempfile::tempdir().unwrap();
    let (files, created) = ensure(directory.path(), &["db.example".to_string()]).unwrap();
    assert!(created);
    let (again, created_again) = ensure(directory.path(), &[]).unwrap();
    // A host no certificate could name is refused, not written.
    let error = ensure(&directory.path().join("other"), &["bad name".to_string()]).unwrap_err();
    assert!(error.to_string().contains("bad name"), "{error}");
    assert!(!directory.path().join("other").exists());
    assert_eq!(files, again);
    assert!(!created_again);
    for key in [&files.ca_key, &files.node_key, &files.client_key] {
        let mode = std::fs::metadata(key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", key.display());
    }
}

/// Rewrites `path` in place with `bytes`, keeping its modification time: what a copy that
/// keeps times does, or two writes within one timestamp tick.
fn rewrite_keeping_time(path: &Path, bytes: &[u8]) {
    let before = std::fs::metadata(path).unwrap().modified().unwrap();
    std::fs::write(path, bytes).unwrap();
    std::fs::OpenOptions::new().write(true).open(path).unwrap().set_modified(before).unwrap();
}

#[tokio::test]
async fn a_same_size_rewrite_that_keeps_the_time_is_reloaded() {
    let directory = tempfile::tempdir().unwrap();
    let old = authority(&directory.path().join("old"));
    let size = std::fs::read(&old.node_certificate).unwrap().len();
    // A new authority whose certificate has the same size (P-256 keys always do).
    let new = (0..64)
        .map(|index| authority(&directory.path().join(format!("new-{index}"))))
        .find(|new| std::fs::read(&new.node_certificate).unwrap().len() == size)
        .expect("a certificate of the same size");
    let (tls, certificate, key) = listener_on_a_copy_of(directory.path(), &old);
    rewrite_keeping_time(&certificate, &std::fs::read(&new.node_certificate).unwrap());
    rewrite_keeping_time(&key, &std::fs::read(&new.node_key).unwrap());
    assert!(tls.reload_if_changed().unwrap(), "same size, same time, other contents");
    let address = echo_server(tls).await;
    assert!(round_trip(&client(&new, false), &address).await.is_ok());
}

#[tokio::test]
async fn a_client_trusts_a_new_ca_once_its_file_is_reloaded() {
    let directory = tempfile::tempdir().unwrap();
    let old = authority(&directory.path().join("old"));
    let new = authority(&directory.path().join("new"));
    let ca = directory.path().join("ca.pem");
    std::fs::copy(&old.ca_certificate, &ca).unwrap();
    let trusting =
        ClientTls::load(&ClientTlsFiles { ca: ca.clone(), certificate_and_key: None }).unwrap();
    let tls = ServerTls::load(server_files(&new, ClientCertificates::NotAsked)).unwrap();
    let address = echo_server(tls).await;
    assert!(round_trip(&trusting, &address).await.is_err(), "the new CA is not trusted yet");
    // The operator adds the new CA to the file: clones of the client see it after a reload.
    let both =
        [std::fs::read(&old.ca_certificate).unwrap(), std::fs::read(&new.ca_certificate).unwrap()]
            .concat();
    std::fs::write(&ca, both).unwrap();
    let clone = trusting.clone();
    assert!(trusting.reload_if_changed().unwrap());
    assert_eq!(round_trip(&clone, &address).await.unwrap(), b"hello over tls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_futures_dropped_midway_lose_no_connection() {
    let directory = tempfile::tempdir().unwrap();
    let ours = authority(directory.path());
    let tls = ServerTls::load(server_files(&ours, ClientCertificates::NotAsked)).unwrap();
    let network = TlsNetwork::new(Arc::new(TcpNetwork), Some(tls), None);
    let mut listener = network.bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_address();
    let clients: Vec<_> = (0..40u8)
        .map(|index| {
            let (trusting, address) = (client(&ours, false), address.clone());
            tokio::spawn(async move {
                let network = TlsNetwork::new(Arc::new(TcpNetwork), None, Some(trusting));
                let mut connection = network.connect(&address).await.unwrap();
                connection.writer.write_all(&[index]).await.unwrap();
                connection.writer.flush().await.unwrap();
                let mut byte = [0u8; 1];
                connection.reader.read_exact(&mut byte).await.unwrap();
                assert_eq!(byte[0], index);
            })
        })
        .collect();
    // Every accept() future is dropped after 200 µs: no accepted socket and no finished
    // handshake may be lost with it.
    let mut served = 0;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while served < 40 && tokio::time::Instant::now() < deadline {
        let patience = std::time::Duration::from_micros(200);
        if let Ok(Ok(connection)) = tokio::time::timeout(patience, listener.accept()).await {
            served += 1;
            tokio::spawn(async move {
                let Connection { mut reader, mut writer, .. } = connection;
                let mut byte = [0u8; 1];
                reader.read_exact(&mut byte).await.unwrap();
                writer.write_all(&byte).await.unwrap();
                writer.flush().await.unwrap();
            });
        }
    }
    assert_eq!(served, 40);
    for client in clients {
        client.await.unwrap();
    }
}
