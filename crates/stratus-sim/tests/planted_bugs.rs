//! Checking the checker: a bug planted on purpose must make the simulation fail. Each planted
//! bug runs beside the same scenario without it, which must pass: the difference is the bug.
//! The bugs are planted by the simulator (`stratus_sim::PlantedBug`, module `wiretap`), never
//! by production code.

use std::time::{Duration, Instant};

use stratus_sim::{run, Fault, PlantedBug, Preload, ScheduledFault, SimulationOptions};

/// 5 servers (R = 3); server 0's tablet holds 3 000 preloaded objects (more than one segment's
/// worth) and a workload's writes; it crashes at 4 s and restarts 3 s later.
fn one_crash(planted_bug: Option<PlantedBug>) -> SimulationOptions {
    SimulationOptions {
        servers: 5,
        replicas: 3,
        clients: 2,
        operations_per_client: 60,
        think_time_max: Duration::from_millis(200),
        scripted_faults: Some(vec![ScheduledFault {
            at: Duration::from_secs(4),
            fault: Fault::CrashServer {
                server: 0,
                down_for: Duration::from_secs(3),
                flip_bit: false,
            },
        }]),
        preload: Some(Preload {
            servers: vec![0],
            objects_per_server: 3_000,
            value_bytes: 64,
            extra_tables: 0,
        }),
        await_every_server: true,
        planted_bug,
        ..SimulationOptions::default()
    }
}

/// A recovery that never reads one segment of the crashed log (the coordinator's request names
/// its last segment's place with its first's) loses what only that segment held: the history
/// check finds acknowledged writes gone. The same run without the bug keeps every invariant.
#[test]
fn a_recovery_that_skips_a_segment_fails_the_run() {
    let started = Instant::now();
    let report =
        run(31, &one_crash(None)).unwrap_or_else(|failure| panic!("without the bug: {failure}"));
    assert_eq!(report.servers_recovered, 1, "{report}");
    let failure = run(31, &one_crash(Some(PlantedBug::RecoverySkipsASegment)))
        .expect_err("a recovery that skipped a segment passed");
    let tampered = failure
        .report
        .measurements
        .as_ref()
        .map_or(0, |measured| measured.wiretap.tampered_frames());
    eprintln!(
        "{{\"scenario\":\"planted_bug\",\"bug\":\"recovery_skips_a_segment\",\"seed\":31,\
         \"requests_tampered\":{tampered},\"caught\":true,\"wall_s\":{:.1},\"reason\":{:?}}}",
        started.elapsed().as_secs_f64(),
        failure.reason.lines().next().unwrap_or_default(),
    );
    assert!(tampered > 0, "the bug never fired: {failure}");
    assert!(failure.reason.starts_with("history check"), "caught, but not as lost data: {failure}");
}

/// The same bug under the main workload alone (no preload): how often its loss shows depends
/// on what the skipped segment held. Reported, over `STRATUS_SIM_SEEDS` seeds (default 20):
/// `cargo test -p stratus-sim --test planted_bugs -- --ignored --nocapture`.
#[test]
#[ignore = "many seeds: run by hand"]
fn a_recovery_that_skips_a_segment_under_the_workload_alone() {
    let seeds: u64 =
        std::env::var("STRATUS_SIM_SEEDS").ok().and_then(|text| text.parse().ok()).unwrap_or(20);
    let (mut caught, mut fired) = (0, 0);
    for seed in 0..seeds {
        let options = SimulationOptions {
            preload: None,
            ..one_crash(Some(PlantedBug::RecoverySkipsASegment))
        };
        let (tampered, verdict) = match run(seed, &options) {
            Ok(report) => (
                report
                    .measurements
                    .as_ref()
                    .map_or(0, |measured| measured.wiretap.tampered_frames()),
                None,
            ),
            Err(failure) => (
                failure
                    .report
                    .measurements
                    .as_ref()
                    .map_or(0, |measured| measured.wiretap.tampered_frames()),
                Some(failure.reason.lines().next().unwrap_or_default().to_string()),
            ),
        };
        fired += usize::from(tampered > 0);
        caught += usize::from(verdict.is_some());
        eprintln!("{{\"seed\":{seed},\"requests_tampered\":{tampered},\"caught\":{:?}}}", verdict);
    }
    eprintln!(
        "{{\"scenario\":\"planted_bug_without_preload\",\"seeds\":{seeds},\"fired\":{fired},\"caught\":{caught}}}"
    );
    assert!(caught > 0, "the bug fired in {fired} seeds and was never caught");
}
