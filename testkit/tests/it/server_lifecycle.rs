//! The testkit's promises, checked against the real binary: a started server answers,
//! a paused one does not (and answers again after resume), a killed one frees its port,
//! a restarted one is back on the same port with the same options, and a dropped one —
//! also in a panicking test, also while paused — is gone.

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use futures::StreamExt;
use nix::sys::signal;
use nix::unistd::Pid;
use weir_testkit::{Auth, ErrorKind, NatsServer, NatsServerOptions};

/// Bound on any wait for something that should happen promptly.
const PROMPT: Duration = Duration::from_secs(5);

/// Connects, reads `INFO`, sends `CONNECT` + `PING` and expects `PONG`, each step bounded
/// by `timeout`. Blocking; a paused server fails at the `INFO` step.
fn ping_pong(port: u16, timeout: Duration) -> Result<(), String> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|e| format!("set timeouts: {e}"))?;
    let mut reader = BufReader::new(stream.try_clone().map_err(|e| e.to_string())?);
    let mut line = String::new();
    reader
        .read_line(&mut line)
        .map_err(|e| format!("read INFO: {e}"))?;
    if !line.starts_with("INFO ") {
        return Err(format!("expected INFO, got {line:?}"));
    }
    (&stream)
        .write_all(b"CONNECT {\"verbose\":false,\"pedantic\":false}\r\nPING\r\n")
        .map_err(|e| format!("write PING: {e}"))?;
    line.clear();
    reader
        .read_line(&mut line)
        .map_err(|e| format!("read PONG: {e}"))?;
    if line == "PONG\r\n" {
        Ok(())
    } else {
        Err(format!("expected PONG, got {line:?}"))
    }
}

fn process_exists(pid: u32) -> bool {
    let pid = Pid::from_raw(i32::try_from(pid).expect("pid fits i32"));
    signal::kill(pid, None).is_ok()
}

fn options() -> async_nats::ConnectOptions {
    async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_millis(500))
        .ping_interval(Duration::from_secs(1))
}

async fn connect(url: &str) -> async_nats::Client {
    tokio::time::timeout(PROMPT, options().connect(url))
        .await
        .expect("connect within 5 s")
        .expect("connect")
}

/// Publishes `payload` on `subject` and waits (bounded) until `sub` delivers it.
async fn round_trip(client: &async_nats::Client, sub: &mut async_nats::Subscriber, subject: &str) {
    client
        .publish(subject.to_owned(), "x".into())
        .await
        .expect("publish");
    let msg = tokio::time::timeout(PROMPT, sub.next())
        .await
        .expect("message within 5 s")
        .expect("subscription open");
    assert_eq!(msg.subject.as_str(), subject);
}

#[test]
fn start_reports_a_ready_loopback_server() {
    let server = NatsServer::start().expect("nats-server");
    assert_eq!(server.url(), format!("nats://127.0.0.1:{}", server.port()));
    assert!(server.is_running());
    assert!(!server.is_paused());
    assert!(process_exists(server.pid()));
    ping_pong(server.port(), Duration::from_millis(500)).expect("PING/PONG right after start");
    assert!(server.log_path().exists());
    assert_eq!(server.store_dir(), None);
}

#[test]
fn servers_started_together_get_distinct_ports() {
    let servers: Vec<NatsServer> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4).map(|_| s.spawn(NatsServer::start)).collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread").expect("nats-server"))
            .collect()
    });
    let mut ports: Vec<u16> = servers.iter().map(NatsServer::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), servers.len(), "ports {ports:?}");
    for server in &servers {
        ping_pong(server.port(), Duration::from_millis(500)).expect("PING/PONG");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_silences_the_server_and_resume_brings_it_back() {
    let server = NatsServer::start().expect("nats-server");
    let client = connect(server.url()).await;
    let mut sub = client
        .subscribe("lifecycle.pause")
        .await
        .expect("subscribe");
    round_trip(&client, &mut sub, "lifecycle.pause").await;

    server.pause().expect("pause");
    assert!(server.is_paused());
    server.pause().expect("pausing twice is a no-op");
    let err = ping_pong(server.port(), Duration::from_millis(300))
        .expect_err("a paused server must not answer");
    assert!(err.contains("INFO"), "fails waiting for INFO: {err}");
    client
        .publish("lifecycle.pause", "during".into())
        .await
        .expect("publish is only queued locally");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), sub.next())
            .await
            .is_err(),
        "nothing may be delivered while the server is stopped"
    );

    server.resume().expect("resume");
    assert!(!server.is_paused());
    let msg = tokio::time::timeout(PROMPT, sub.next())
        .await
        .expect("the message sent during the pause arrives after resume")
        .expect("subscription open");
    assert_eq!(msg.payload.as_ref(), b"during");
    ping_pong(server.port(), Duration::from_millis(500)).expect("PING/PONG after resume");
    round_trip(&client, &mut sub, "lifecycle.pause").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_frees_the_port_and_restart_returns_on_it() {
    let server = NatsServer::start().expect("nats-server");
    let port = server.port();
    let first_pid = server.pid();
    let client = connect(server.url()).await;
    let mut sub = client
        .subscribe("lifecycle.restart")
        .await
        .expect("subscribe");

    server.kill().expect("kill");
    assert!(!server.is_running());
    assert!(!process_exists(first_pid), "killed process is reaped");
    assert!(
        TcpStream::connect_timeout(
            &SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
            Duration::from_millis(300)
        )
        .is_err(),
        "nothing listens after kill"
    );
    server.kill().expect("killing twice is a no-op");
    let err = server.pause().expect_err("cannot pause a killed server");
    assert_eq!(err.kind(), ErrorKind::NotRunning);

    server.restart().expect("restart");
    assert_eq!(server.port(), port);
    assert_eq!(server.url(), format!("nats://127.0.0.1:{port}"));
    assert_ne!(server.pid(), first_pid);
    assert!(server.is_running());
    ping_pong(port, Duration::from_millis(500)).expect("PING/PONG after restart");

    // The client that was connected before the kill reconnects and re-subscribes.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        client
            .publish("lifecycle.restart", "again".into())
            .await
            .expect("publish");
        if let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(200), sub.next()).await {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "old client did not reconnect within 10 s"
        );
    }
}

#[test]
fn restart_while_paused_and_while_running() {
    let server = NatsServer::start().expect("nats-server");
    let port = server.port();
    server.pause().expect("pause");
    server.restart().expect("restart a paused server");
    assert!(!server.is_paused());
    ping_pong(port, Duration::from_millis(500)).expect("PING/PONG");
    server.restart().expect("restart a running server");
    assert_eq!(server.port(), port);
    ping_pong(port, Duration::from_millis(500)).expect("PING/PONG");
}

#[test]
fn drop_kills_the_server_even_when_the_test_panics() {
    let (pid_tx, pid_rx) = std::sync::mpsc::channel();
    let outcome = std::panic::catch_unwind(move || {
        let server = NatsServer::start().expect("nats-server");
        pid_tx.send(server.pid()).expect("send pid");
        server.pause().expect("pause");
        panic!("a failing test with a paused server");
    });
    assert!(outcome.is_err());
    let pid = pid_rx.recv().expect("pid");
    assert!(!process_exists(pid), "nats-server {pid} outlived the test");

    let server = NatsServer::start().expect("nats-server");
    let pid = server.pid();
    let dir = server.log_path().parent().expect("temp dir").to_owned();
    drop(server);
    assert!(!process_exists(pid), "nats-server {pid} outlived its value");
    assert!(!dir.exists(), "temporary directory removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_text_is_applied() {
    let server = NatsServer::start_with(NatsServerOptions {
        config: Some("max_payload: 4096\n".into()),
        ..Default::default()
    })
    .expect("nats-server");
    let client = connect(server.url()).await;
    assert_eq!(client.server_info().max_payload, 4096);
    drop(client);

    server.restart().expect("restart");
    let client = connect(server.url()).await;
    assert_eq!(
        client.server_info().max_payload,
        4096,
        "restart keeps the config"
    );
}

#[test]
fn a_broken_config_is_reported_with_the_server_log() {
    let err = NatsServer::start_with(NatsServerOptions {
        config: Some("this is { not a config".into()),
        ..Default::default()
    })
    .expect_err("broken config");
    assert_eq!(err.kind(), ErrorKind::Exited, "{err}");
    let message = err.to_string();
    assert!(message.contains("exited during startup"), "{message}");
    assert!(message.contains("weir-testkit: launching"), "{message}");
}

#[test]
fn an_explicit_binary_that_does_not_exist_is_a_spawn_error() {
    let err = NatsServer::start_with(NatsServerOptions {
        binary: Some("/nonexistent/nats-server".into()),
        ..Default::default()
    })
    .expect_err("no such binary");
    assert_eq!(err.kind(), ErrorKind::Spawn, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_password_auth_is_required() {
    let server = NatsServer::start_with(NatsServerOptions {
        auth: Some(Auth::UserPassword {
            user: "weir".into(),
            password: "s3cret".into(),
        }),
        ..Default::default()
    })
    .expect("nats-server");
    let refused = tokio::time::timeout(PROMPT, options().connect(server.url()))
        .await
        .expect("answer within 5 s");
    assert!(refused.is_err(), "connecting without credentials must fail");

    let client = tokio::time::timeout(
        PROMPT,
        async_nats::ConnectOptions::with_user_and_password("weir".into(), "s3cret".into())
            .connection_timeout(Duration::from_millis(500))
            .connect(server.url()),
    )
    .await
    .expect("answer within 5 s")
    .expect("connect with credentials");
    let mut sub = client.subscribe("auth.user").await.expect("subscribe");
    round_trip(&client, &mut sub, "auth.user").await;
    let log = std::fs::read_to_string(server.log_path()).expect("log");
    assert!(
        !log.contains("s3cret"),
        "the log must not show the password"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_auth_is_required() {
    let server = NatsServer::start_with(NatsServerOptions {
        auth: Some(Auth::Token("t0ken".into())),
        ..Default::default()
    })
    .expect("nats-server");
    let refused = tokio::time::timeout(PROMPT, options().connect(server.url()))
        .await
        .expect("answer within 5 s");
    assert!(refused.is_err(), "connecting without the token must fail");

    let client = tokio::time::timeout(
        PROMPT,
        async_nats::ConnectOptions::with_token("t0ken".into())
            .connection_timeout(Duration::from_millis(500))
            .connect(server.url()),
    )
    .await
    .expect("answer within 5 s")
    .expect("connect with token");
    let mut sub = client.subscribe("auth.token").await.expect("subscribe");
    round_trip(&client, &mut sub, "auth.token").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_data_survives_a_restart() {
    let server = NatsServer::start_with(NatsServerOptions {
        jetstream: true,
        ..Default::default()
    })
    .expect("nats-server");
    let store = server.store_dir().expect("store dir with JetStream");

    let client = connect(server.url()).await;
    let js = async_nats::jetstream::new(client);
    tokio::time::timeout(
        PROMPT,
        js.create_stream(async_nats::jetstream::stream::Config {
            name: "LIFECYCLE".into(),
            subjects: vec!["lifecycle.js.>".into()],
            ..Default::default()
        }),
    )
    .await
    .expect("create within 5 s")
    .expect("create stream");
    let ack = tokio::time::timeout(PROMPT, async {
        js.publish("lifecycle.js.1", "kept".into())
            .await
            .expect("publish")
            .await
    })
    .await
    .expect("ack within 5 s")
    .expect("ack");
    assert_eq!(ack.sequence, 1);
    assert!(store.exists(), "JetStream writes into the store dir");
    drop(js);

    server.restart().expect("restart");
    let js = async_nats::jetstream::new(connect(server.url()).await);
    let mut stream = tokio::time::timeout(PROMPT, js.get_stream("LIFECYCLE"))
        .await
        .expect("lookup within 5 s")
        .expect("stream still there after restart");
    let info = tokio::time::timeout(PROMPT, stream.info())
        .await
        .expect("info within 5 s")
        .expect("stream info");
    assert_eq!(info.state.messages, 1);
}

#[test]
fn version_is_known_and_supports_partition_mapping() {
    let version = weir_testkit::nats_server_version().expect("nats-server --version");
    assert!(
        version.at_least(2, 8),
        "partition() mapping needs nats-server >= 2.8, found {version}"
    );
}

#[test]
fn a_server_is_shared_between_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<NatsServer>();

    let server = std::sync::Arc::new(NatsServer::start().expect("nats-server"));
    let chaos = std::sync::Arc::clone(&server);
    std::thread::spawn(move || {
        chaos.pause().expect("pause from another thread");
        chaos.resume().expect("resume from another thread");
        chaos.restart().expect("restart from another thread");
    })
    .join()
    .expect("thread");
    ping_pong(server.port(), Duration::from_millis(500)).expect("PING/PONG");
}
