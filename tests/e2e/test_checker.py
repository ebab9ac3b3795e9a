"""The checker must catch what it claims to catch: each defect on synthetic data."""

from checker import Report, analyze, payload


def stored(*records):
    return {(p, o): payload(name, seq) for p, o, name, seq in records}


def test_checker_clean_run_reports_nothing():
    log = stored((0, 0, "a", 0), (0, 1, "a", 2), (1, 0, "a", 1))
    acked = [(0, 0, payload("a", 0)), (0, 1, payload("a", 2)), (1, 0, payload("a", 1))]
    report = analyze(log, {0: (0, 2), 1: (0, 1)}, acked, Report("t", 0))
    assert (report.acked, report.lost, report.duplicated, report.reordered, report.gaps) == (3, 0, 0, 0, 0)


def test_checker_detects_lost_duplicated_reordered_and_gaps():
    log = stored((0, 0, "a", 0), (0, 1, "a", 4), (0, 2, "a", 2), (0, 3, "a", 4), (0, 5, "b", 1))
    acked = [(0, 0, payload("a", 0)), (0, 4, payload("a", 6)), (1, 0, payload("a", 1))]
    report = analyze(log, {0: (0, 6), 1: (0, 0)}, acked, Report("t", 0))
    assert report.lost == 2          # offset 4 empty; partition 1 never stored its record
    assert report.duplicated == 1    # a:4 twice
    assert report.reordered == 1     # a:2 after a:4 in partition 0
    assert report.gaps == 1          # offset 4 of partition 0


def test_checker_looks_up_an_ack_without_an_offset_by_value_in_its_partition():
    log = stored((0, 0, "a", 0), (0, 1, "a", 1), (1, 0, "a", 2))
    acked = [(0, None, payload("a", 1)),   # stored in partition 0: not lost
             (0, -1001, payload("a", 0)),  # librdkafka's invalid offset: looked up the same way
             (0, None, payload("a", 2)),   # stored, but in partition 1: lost
             (1, None, payload("a", 3))]   # stored nowhere: lost
    report = analyze(log, {0: (0, 2), 1: (0, 1)}, acked, Report("t", 0))
    assert report.lost == 2
