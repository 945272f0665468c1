"""The n-gram table: learnt from one partition's answers, used for that partition only."""

from inference.engine.speculation.table import NgramTable


def test_it_drafts_what_a_partitions_earlier_answers_said_after_the_same_context():
    table = NgramTable()
    table.learn("apikey:1", [1, 2, 3, 4, 5, 6, 7])
    assert table.draft("apikey:1", [9, 1, 2, 3], 3) == [4, 5, 6]


def test_another_partition_never_sees_it():
    table = NgramTable()
    table.learn("apikey:1", [1, 2, 3, 4, 5, 6, 7])
    assert table.draft("apikey:2", [1, 2, 3], 3) == []
    assert table.draft(None, [1, 2, 3], 3) == []


def test_the_most_frequent_continuation_wins():
    table = NgramTable()
    for answer in ([1, 2, 3, 8], [1, 2, 3, 9], [1, 2, 3, 9]):
        table.learn("p", answer)
    assert table.draft("p", [1, 2, 3], 1) == [9]


def test_it_is_bounded_per_partition_and_in_partitions():
    table = NgramTable(max_contexts=10, max_partitions=2)
    table.learn("a", list(range(100)))
    assert table.contexts == 10
    table.learn("b", [1, 2, 3, 4])
    table.learn("c", [1, 2, 3, 4])
    assert table.draft("a", [97, 98, 99], 1) == [] and table.draft("c", [1, 2, 3], 1) == [4]


def test_forgetting_a_partition_forgets_what_it_taught():
    table = NgramTable()
    table.learn("a", [1, 2, 3, 4])
    table.learn("b", [1, 2, 3, 5])
    table.forget("a")
    assert table.draft("a", [1, 2, 3], 1) == [] and table.draft("b", [1, 2, 3], 1) == [5]
