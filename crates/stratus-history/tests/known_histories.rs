//! The checker on hand-written histories of one key: known-good ones must pass, known-bad ones
//! must fail with the right violation and name the operations involved.

mod common;

use common::*;
use stratus_client::Status;
use stratus_history::{check, CheckOptions, History, Verdict, Violation};
use stratus_types::{RejectRules, Version};

fn verdict(history: &History) -> Verdict {
    let report = check(history, &CheckOptions::default());
    assert_eq!(report.keys.len(), 1, "one key");
    report.keys[0].verdict.clone()
}

fn assert_linearizable(history: History) {
    let report = check(&history, &CheckOptions::default());
    assert!(report.is_linearizable(), "expected linearizable:\n{report}\nhistory:\n{history}");
}

fn violation_of(history: History) -> Violation {
    match verdict(&history) {
        Verdict::Violation(violation) => {
            // The report must print the violation readably.
            let report = check(&history, &CheckOptions::default());
            assert!(report.to_string().contains("key \"k\""), "{report}");
            *violation
        }
        other => panic!("expected a violation, got {other:?}\nhistory:\n{history}"),
    }
}

#[test]
fn sequential_history_is_linearizable() {
    assert_linearizable(history(vec![
        record(1, 2, read(), missing()),
        record(3, 4, write("a"), written(1)),
        record(5, 6, read(), value("a", 1)),
        record(7, 8, write("b"), written(2)),
        record(9, 10, read(), value("b", 2)),
        record(11, 12, remove(), removed(2)),
        record(13, 14, read(), missing()),
        record(15, 16, remove(), removed(0)),
        // Versions are never reused across remove and re-create: the next is above 2.
        record(17, 18, write("c"), written(5)),
        record(19, 20, read(), value("c", 5)),
    ]));
}

#[test]
fn concurrent_overlapping_history_is_linearizable() {
    assert_linearizable(history(vec![
        record(1, 10, write("a"), written(1)),
        record(2, 11, write("b"), written(2)),
        // Both writes may take effect before this read ends, in version order.
        record(3, 4, read(), value("b", 2)),
        record(5, 12, read(), value("b", 2)),
        record(13, 14, read(), value("b", 2)),
    ]));
    // The opposite real-time order of effects is also fine while they overlap.
    assert_linearizable(history(vec![
        record(1, 10, write("a"), written(1)),
        record(2, 11, read(), missing()),
        record(3, 12, read(), value("a", 1)),
        record(4, 13, remove(), removed(1)),
        record(5, 14, read(), value("a", 1)),
    ]));
}

#[test]
fn unknown_outcomes_that_did_and_did_not_apply_are_linearizable() {
    // Applied: a later read sees the value at a version nobody reported.
    assert_linearizable(history(vec![
        record(1, 2, write("a"), written(1)),
        record(3, 4, write("b"), unknown()),
        record(5, 6, read(), value("b", 7)),
        record(7, 8, write("c"), written(8)),
    ]));
    // Not applied.
    assert_linearizable(history(vec![
        record(1, 2, write("a"), written(1)),
        record(3, 4, write("b"), unknown()),
        record(5, 6, read(), value("a", 1)),
        record(7, 8, read(), value("a", 1)),
    ]));
    // Applied late: after the client gave up on it.
    assert_linearizable(history(vec![
        record(1, 2, write("a"), written(1)),
        record(3, 4, write("b"), unknown()),
        record(5, 6, read(), value("a", 1)),
        record(7, 8, read(), value("b", 3)),
    ]));
    // An unknown remove, and a read whose outcome is unknown (it constrains nothing).
    assert_linearizable(history(vec![
        record(1, 2, write("a"), written(1)),
        record(3, 4, remove(), unknown()),
        record(5, 6, read(), unknown()),
        record(7, 8, read(), missing()),
    ]));
}

#[test]
fn increments_and_conditional_operations_are_linearizable() {
    assert_linearizable(history(vec![
        record(1, 2, increment(5), incremented(5, 1)),
        record(3, 4, increment(-7), incremented(-2, 2)),
        record(5, 6, read(), integer(-2, 2)),
        record(7, 8, write_if("x", RejectRules::version_equals(Version(2))), written(3)),
        record(
            9,
            10,
            write_if("y", RejectRules::version_equals(Version(2))),
            refused(Status::WrongVersion, 3),
        ),
        record(11, 12, write_if("z", RejectRules::create_only()), refused(Status::ObjectExists, 3)),
        record(13, 14, increment(1), refused(Status::InvalidObject, 3)),
        record(15, 16, read(), value("x", 3)),
    ]));
    // An unknown increment pinned down by a later read.
    assert_linearizable(history(vec![
        record(1, 2, increment(5), incremented(5, 1)),
        record(3, 4, increment(1), unknown()),
        record(5, 6, increment(1), incremented(7, 9)),
    ]));
}

#[test]
fn stale_read_after_completed_write_is_rejected() {
    let violation = violation_of(history(vec![
        record(1, 2, write("a"), written(1)),
        record(3, 4, write("b"), written(2)),
        record(5, 6, read(), value("a", 1)),
    ]));
    let Violation::StaleRead { write, read } = violation else { panic!("{violation}") };
    assert_eq!((write.invoked, read.invoked), (3, 5));
}

#[test]
fn lost_acknowledged_write_is_rejected() {
    let violation = violation_of(history(vec![
        record(1, 2, write("a"), written(1)),
        record(3, 4, read(), missing()),
    ]));
    assert!(matches!(violation, Violation::LostWrite { .. }), "{violation}");
    // A remove that may lie between them explains the missing object.
    assert_linearizable(history(vec![
        record(1, 2, write("a"), written(1)),
        record(2, 9, remove(), removed(1)),
        record(3, 4, read(), missing()),
    ]));
}

#[test]
fn non_monotonic_versions_are_rejected() {
    let violation = violation_of(history(vec![
        record(1, 2, write("a"), written(5)),
        record(3, 4, write("b"), written(3)),
    ]));
    assert!(matches!(violation, Violation::VersionsNotIncreasing { .. }), "{violation}");
    let violation = violation_of_duplicate();
    assert!(matches!(violation, Violation::DuplicateVersion { .. }), "{violation}");
    // A re-created object reusing the removed version.
    let violation = violation_of(history(vec![
        record(1, 2, write("a"), written(4)),
        record(3, 4, remove(), removed(4)),
        record(5, 6, write("b"), written(4)),
    ]));
    assert!(matches!(violation, Violation::DuplicateVersion { .. }), "{violation}");
}

fn violation_of_duplicate() -> Violation {
    violation_of(history(vec![
        record(1, 5, write("a"), written(2)),
        record(2, 6, write("b"), written(2)),
    ]))
}

#[test]
fn read_of_a_value_never_written_is_rejected() {
    let violation = violation_of(history(vec![
        record(1, 2, write("a"), written(1)),
        record(3, 4, read(), value("zzz", 1)),
    ]));
    let Violation::NotLinearizable { operations, stuck } = violation else { panic!("{violation}") };
    assert_eq!(operations.len(), 2);
    assert_eq!(stuck.invoked, 3);
    let violation = violation_of(history(vec![record(1, 2, read(), value("zzz", 9))]));
    assert!(matches!(violation, Violation::NotLinearizable { .. }), "{violation}");
}

#[test]
fn reads_disagreeing_on_order_are_rejected_and_shrunk_to_the_operations_involved() {
    let mut operations = vec![
        record(1, 10, write("a"), written(1)),
        record(2, 11, write("b"), written(2)),
        // The first read sees b, so both writes took effect; a later read cannot see a.
        record(3, 4, read(), value("b", 2)),
        record(5, 6, read(), value("a", 1)),
    ];
    // Unrelated, valid traffic afterwards must not appear in the report.
    for index in 0..20u64 {
        let time = 20 + 4 * index;
        let name = format!("n{index}");
        operations.push(record(time, time + 1, write(&name), written(3 + index)));
        operations.push(record(time + 2, time + 3, read(), value(&name, 3 + index)));
    }
    let violation = violation_of(history(operations));
    let Violation::NotLinearizable { operations, .. } = &violation else { panic!("{violation}") };
    let mut times: Vec<u64> = operations.iter().map(|operation| operation.invoked).collect();
    times.sort_unstable();
    assert_eq!(times, vec![1, 2, 3, 5], "{violation}");
}

#[test]
fn wrong_increment_arithmetic_is_rejected() {
    let violation = violation_of(history(vec![
        record(1, 2, increment(5), incremented(5, 1)),
        record(3, 4, increment(5), incremented(11, 2)),
    ]));
    assert!(matches!(violation, Violation::NotLinearizable { .. }), "{violation}");
}

#[test]
fn a_history_beyond_the_search_bound_is_reported_undecided() {
    // Many overlapping unknown writes of distinct values, then reads nobody can explain until
    // every order has been tried: the search runs out of steps instead of running forever.
    let mut operations = Vec::new();
    for index in 0..40u64 {
        operations.push(record(1 + index, 1000 + index, write(&format!("v{index}")), unknown()));
    }
    operations.push(record(2000, 2001, read(), value("never", 999)));
    let options = CheckOptions { search_steps_max: 10_000, ..CheckOptions::default() };
    let report = check(&history(operations), &options);
    assert!(matches!(report.keys[0].verdict, Verdict::TooLarge { .. }), "{report}");
    assert!(report.to_string().contains("undecided"), "{report}");
}
