"""What the audit can find: the catalogue of rules (name, class, invariant, meaning) and the Finding value.

Classes:
- "violation": the cluster broke a promise (exit status 1);
- "reported": worth a look but no promise broken (under-replication; ranges the inputs cannot decide);
- "benign": normal after crashes, retries and recoveries (PROTOCOL.md §7, "Benign, not violations").

A Finding names one fact with where it is: a ledger and an entry range, a bookie, a file and an offset (what
is not known is None); a replica finding (gap, below_ack_quorum, under_replicated, unverifiable) also names
`missing`, the bookies of the entries' write sets that hold no valid copy in the inputs (each entry of the
range lacks exactly those; for a run of entries no bookie holds, the union of their write sets). Findings sort by `sort_key`, a total order, so reports are byte-identical whichever
driver (local or Spark) found them and in whatever order.
"""
from __future__ import annotations

from dataclasses import dataclass

VIOLATION = "violation"
REPORTED = "reported"
BENIGN = "benign"

# name -> (class, invariant of PROTOCOL.md §7 or "RecordIntegrity", meaning)
RULES: dict[str, tuple[str, str, str]] = {
    "journal_bad_header": (VIOLATION, "RecordIntegrity", "a journal whose header is unreadable and that is not a "
                           "torn newest journal: replay refuses to start"),
    "journal_foreign_instance": (VIOLATION, "RecordIntegrity", "a journal of another cluster instance than the "
                                 "bookie's cookie (or the snapshot) names: replay refuses to start"),
    "journal_crc_failure": (VIOLATION, "RecordIntegrity", "a framed record that fails its CRC32C (or has an "
                            "unknown type) with valid records after it: replay refuses to start"),
    "journal_garbage": (VIOLATION, "RecordIntegrity", "bytes that are no record, in the middle of a journal "
                        "(valid records follow)"),
    "journal_corrupt_tail": (VIOLATION, "RecordIntegrity", "damage running to the end of a journal that is not "
                             "a torn tail of the bookie's newest journal"),
    "torn_tail_below_checkpoint": (VIOLATION, "AllAckedEntriesAreReadable", "a torn tail that starts below the "
                                   "bookie's checkpoint mark: bytes the bookie had synced are gone"),
    "entrylog_bad_header": (VIOLATION, "RecordIntegrity", "an entry log whose header is unreadable"),
    "entrylog_damaged": (VIOLATION, "RecordIntegrity", "a rolled entry log (ledger map written) that does not "
                         "parse to its end"),
    "entry_malformed": (VIOLATION, "RecordIntegrity", "an ENTRY record whose body is no entry (short, or "
                        "negative ids)"),
    "entry_digest_mismatch": (VIOLATION, "RecordIntegrity", "a stored entry whose digest does not match its "
                              "bytes: a bad replica (it does not count as a copy)"),
    "gap": (VIOLATION, "AllCommittedEntriesReachAckQuorum", "an entry id <= the confirmed end held by no bookie"),
    "below_ack_quorum": (VIOLATION, "AllCommittedEntriesReachAckQuorum", "an entry id <= the confirmed end held "
                         "by fewer than Qa bookies of its segment"),
    "divergence": (VIOLATION, "NoLogDivergence", "two copies of an entry id <= the confirmed end with "
                   "different bytes"),
    "write_after_fence": (VIOLATION, "FencedWriterMakesNoProgress", "a normal (not RECOVERY_ADD) add journaled "
                          "by a bookie after it journaled the ledger's fence, not identical to an earlier copy"),
    "lac_decreased": (VIOLATION, "LacMonotonic", "a piggybacked or explicit LAC lower than one the bookie "
                      "journaled before (first copies of normal adds, and explicit LACs, in journal order)"),
    "lac_above_last_entry": (VIOLATION, "NoDivergenceBetweenClientAndMetaData", "a LAC above a CLOSED "
                             "ledger's last_entry_id: the writer confirmed an entry the close dropped"),
    "under_replicated": (REPORTED, "", "an entry id <= the confirmed end held by at least Qa but fewer than Qw "
                         "bookies of its segment"),
    "unverifiable": (REPORTED, "", "an entry id <= the confirmed end held by fewer than Qa bookies when a "
                     "bookie of its segment has no complete journal history in the inputs: cannot be decided"),
    "torn_tail": (BENIGN, "", "the torn last group of a bookie's newest journal (or of an older journal replay "
                  "has moved past): never acknowledged, replay truncates it"),
    "torn_header": (BENIGN, "", "a newest journal whose header was never synced: replay removes it"),
    "entrylog_open_tail": (BENIGN, "", "an entry log without a ledger map (open at a crash) that ends early"),
}

RULE_ORDER = {name: i for i, name in enumerate(RULES)}

# benign facts that are only counted (never listed one by one)
BENIGN_COUNTS = ("duplicates", "above_last_entry", "outside_segment", "open_ledger_tail", "unknown_ledger_copies")


def rule_class(rule: str) -> str:
    return RULES[rule][0]


@dataclass(frozen=True, slots=True)
class Finding:
    rule: str
    ledger: int | None = None
    first_entry: int | None = None
    last_entry: int | None = None
    bookie: str | None = None
    file: str | None = None
    offset: int | None = None
    detail: str = ""
    missing: tuple[str, ...] = ()  # replica rules: the write set's bookies with no valid copy (sorted)

    def __post_init__(self) -> None:
        assert self.rule in RULES, f"unknown audit rule {self.rule!r}"
        assert (self.first_entry is None) == (self.last_entry is None), self
        assert self.first_entry is None or self.first_entry <= self.last_entry, self

    @property
    def kind(self) -> str:
        return RULES[self.rule][0]

    @property
    def entries(self) -> int:
        return 0 if self.first_entry is None else self.last_entry - self.first_entry + 1

    def sort_key(self) -> tuple:
        def n(v, missing):
            return missing if v is None else v
        return (n(self.ledger, -1), n(self.first_entry, -1), RULE_ORDER[self.rule], n(self.bookie, ""),
                n(self.file, ""), n(self.offset, -1), self.detail, self.missing)

    def to_json(self) -> dict:
        out: dict = {"rule": self.rule, "class": self.kind}
        invariant = RULES[self.rule][1]
        if invariant:
            out["invariant"] = invariant
        for name in ("ledger", "first_entry", "last_entry", "bookie", "file", "offset"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.first_entry is not None:
            out["entries"] = self.entries
        if self.missing:
            out["missing"] = list(self.missing)
        out["detail"] = self.detail
        return out


def sorted_findings(findings) -> list[Finding]:
    return sorted(findings, key=Finding.sort_key)
