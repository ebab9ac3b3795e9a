#!/usr/bin/env bash
# Deliberately broken builds: each named mutation is applied to a scratch copy of the committed
# tree (git archive HEAD), weir-sim is built (release) and run over a seed range, and the mutation
# counts as caught when at least one seed fails. Exits non-zero when the unmutated tree fails a
# seed, a mutation is not caught, or a mutation no longer applies (the code it targets changed).
#
#   tests/mutants/run.sh [SEEDS] [START] [NAME...]      (make mutants SEEDS=30)
#
# Not part of .ci/run: each mutation costs a rebuild. Scratch trees and their shared target dir
# live under $WEIR_MUTANTS_DIR (default /var/tmp/weir-mutants), so rebuilds are incremental.
# Never build a working tree into that target dir: its crates are named as the scratch trees'
# are, so a crate whose sources are older than the last mutant's artifact keeps that mutant.
set -euo pipefail
cd "$(dirname "$0")/../.."
seeds="${1:-30}"
start="${2:-0}"
shift $(( $# > 2 ? 2 : $# ))
root="${WEIR_MUTANTS_DIR:-/var/tmp/weir-mutants}"
export CARGO_TARGET_DIR="$root/target"

# name | file | perl substitution (applied with -0pi: may span lines) | what it breaks
MUTATIONS=(
  "slot-any-already-exists|crates/weir-control/src/log.rs|s/Some\(existing\) if existing == bytes =>/Some(_) =>/|a metadata-log slot write that finds the slot taken counts as written, whoever wrote it (CTL-1, DUR-1)"
  "first-sequence-any|crates/weir-control/src/state/producers.rs|s/if batch.base_sequence == 0 \{/if batch.base_sequence >= 0 {/|an idempotent producer's first batch (or new epoch) may start at any sequence (ORD-1, seed 17's bug)"
  "create-conflict-absent-is-taken|crates/weir-control/src/log.rs|s/None => source,/None => return Ok(Some(Bytes::new())),/|a create-only conflict whose object is absent (S3 409 ConditionalRequestConflict, nothing written) counts as a slot or epoch taken: recovery leaves a hole among dead slots (CTL-1, DUR-1; issue 10 review H1)"
  "epoch-taken-ignored|crates/weir-control/src/log.rs|s/if log_epoch > epoch \{/if false \&\& log_epoch > epoch {/|recovery writes its NewEpoch after a later epoch's records instead of failing with EpochTaken (issue 9 4.1)"
  "ack-before-durable|crates/weir-control/src/plane/writer.rs|s/waiters.push\(\(reply, self.working.apply\(&entry\)\)\);/let result = self.working.apply(\&entry); let _ = reply.send(Ok((result.clone(), seq))); waiters.push((oneshot::channel().0, result));/|the control plane answers an entry, its own or one a follower forwarded, when it is sealed, before its slot is durable (DUR-1; RFC 0002 §4 on cluster seeds)"
  "create-conflict-is-success|crates/weir-storage/src/layer.rs|s/self\\.call\\(RequestClass::Put, \"put\", bytes, (.*?)\\.await/match self.call(RequestClass::Put, \"put\", bytes, \$1.await { Err(object_store::Error::AlreadyExists { .. }) => Ok(PutResult { e_tag: None, version: None, extensions: Default::default() }), other => other }/s|the storage layer reports a lost create-only write as written, like a store that ignores If-None-Match (CTL-1, DUR-1; the startup probe refuses such stores)"
  "log-start-backwards|crates/weir-control/src/state/log_start.rs|s/if offset <= partition.log_start_offset \{/if offset < partition.log_start_offset { partition.log_start_offset = offset; } if offset <= partition.log_start_offset {/|AdvanceLogStart with an offset below the start lowers the start (DUR-2, RFC 0003 check d)"
  "gc-no-grace|crates/weir-control/src/gc.rs|s/now.duration_since\(\*\*seen\) >= self.settings.grace/true/|the file deleter deletes a released file as soon as its release is durable, ignoring its grace: a fetch plan made before the release finds the file gone (GC-1, RFC 0003 check c)"
  "sweep-past-horizon|crates/weir-control/src/state.rs|s/if commit.file_id.unix_ms\(\) < self.sweep_horizon_ms \{/if false \&\& commit.file_id.unix_ms() < self.sweep_horizon_ms {/|apply accepts a commit of a file whose id time is below the orphan sweep horizon: a slow upload commits a file the sweep deleted (DUR-1, RFC 0003 §6 and check b)"
  "log-gc-unfenced|crates/weir-control/src/log/gc.rs|s/if is_fence \{/if false \&\& is_fence {/|log GC deletes fence slots (live NewEpoch records) too: a deposed writer's held slot PUT re-creates a collected slot and acknowledges entries no replay reads (DUR-1, CTL-1; RFC 0003 §7)"
  "recovery-below-snapshot|crates/weir-control/src/log.rs|s/\n\s*self\.check_not_collected\(gap, epoch\)\.await\?;//|recovery skips its snapshot listing after writing its NewEpoch: a recovery stalled while the log was collected past its replay gap serves a stale state and acknowledges what no replay reads (DUR-1; RFC 0003 §7)"
  "producer-expiry-early|crates/weir-control/src/state/expiry.rs|s/\*\*last < before_ms\)/**last < before_ms + 60_000)/|ExpireProducers also forgets producers active within the last minute of its window: live producers lose their state (RFC 0003 §4 and check e)"
  "append-ack-unflushed|crates/weir-storage/src/quorum.rs|s/        writer.append\(writer.offset\(\), part\).await\?;\n    \}\n    writer.flush\(\).await/        writer.append(writer.offset(), part).await?;\n    }\n    Ok(writer.offset())/|a pooled object counts as holding a file once its bytes are appended, before they are flushed: nothing is durable (DUR-1, issue 12)"
  "append-failure-is-success|crates/weir-storage/src/quorum.rs|s/    writer.flush\(\).await\n\}/    Ok(writer.flush().await.unwrap_or_default())\n}/|a failed flush into a pooled object counts as written: a lost append leaves a holder without the file (DUR-1, issue 12)"
  "empty-slot-is-filler|crates/weir-control/src/log.rs|s/a missing slot.\n            return Ok\(None\);/a missing slot.\n            return Ok(Some((0, LogRecord::new(vec![]))));/|replay reads an empty (pre-warmed, unwritten) slot object as a dead filler and goes on past it, so a new leader's NewEpoch lands beyond a slot the deposed writer can still fill and acknowledge (CTL-1, RFC 0004 rule 1)"
  "ambiguous-slot-flush-is-written|crates/weir-control/src/log/prewarm.rs|s/        Err\(err\) => Err\(err\),/        Err(_) => Ok(true),/|a failed flush into a pre-warmed slot counts as written without reading the slot back: a lost append is acknowledged (DUR-1, RFC 0004)"
  "fill-without-takeover|crates/weir-control/src/log.rs|s/prewarm::fill_empty\(appendable.as_ref\(\), key, bytes.clone\(\)\)\n            .await/{ let _ = appendable; match self.store.put(key, bytes.clone().into()).await { Ok(_) => Ok(prewarm::Filled::Written), Err(e) => Err(weir_storage::StorageError::from(e)) } }/|an empty slot object is written by a blind overwrite instead of a takeover: a record another writer landed after the read is destroyed (CTL-1, RFC 0004 rule 2)"
  "fill-skips-later-epoch|crates/weir-control/src/log.rs|s/Some\(found_epoch\) if found_epoch > epoch => \{/Some(found_epoch) if false \&\& found_epoch > epoch => {/|recovery skips every non-empty slot it listed among a deposed writer's as dead, without reading its epoch again: a later writer's NewEpoch written since into an object that was empty is skipped, and the deposed recovery serves and acknowledges slots no replay reads (DUR-1, CTL-1; RFC 0004 point 4; found with slots read concurrently, seeds 583 and 874)"
  "inflight-join-unsliced|crates/weir-fetch/src/inflight.rs|s/let slice = \(range.start - from\) as usize..\(range.end - from\) as usize;/let _ = from; let slice = 0..(range.end - range.start) as usize;/|a read that joins a GET in flight covering its range takes the bytes from the start of that GET, not from its own offset in it: a fetch behind read-ahead, or a second reader of the range, returns another batch's bytes (FET-1; issue 16 read-ahead; the cold read-ahead seeds' second reader sees it)"
  "compact-commit-without-output|crates/weir-compactor/src/lib.rs|s/self\.regional\s*\.put_opts\(&key, payload, create\)\s*\.await/async { drop((payload, create)); Ok::<(), object_store::Error>(()) }.await/|a compaction worker commits its swap without writing its output: the index names a file that is not there (DUR-2, RFC 0005 §4)"
  "compact-wrong-position|crates/weir-compactor/src/merge.rs|s/byte_offset: location\.offset,/byte_offset: location.offset + 1,/|the swap names each batch one byte off its place in the output: consumers read garbage (DUR-2, RFC 0005 §4)"
  "run-trim-wrong-position|crates/weir-control/src/state/compaction.rs|s/byte_offset: run\.byte_offset \+ \(u64::from\(run\.len\) - bytes\),/byte_offset: run.byte_offset,/|a swap whose run lost a prefix to retention meanwhile points what is left at the run's first bytes: the remaining offsets read the removed batches (DUR-2, RFC 0005 §3 and §4)"
  "fetch-run-one-offset|crates/weir-fetch/src/reader.rs|s/rewrite_offsets\(&mut out\[position\.\.\], base, LEADER_EPOCH\)/rewrite_offsets(\&mut out[position..], entry.base_offset, LEADER_EPOCH)/|a fetch stamps every batch of a compacted run with the run's base offset: consumers see records at the wrong offsets (ORD-1, FET-, RFC 0005 §3)"
  "deposed-leader-claims-again|crates/weir-control/src/plane/recovery.rs|s/if deposed_by\(err, position\.epoch\) \{/if false {/; s/Err\(err\) if known\.is_some_and\(/Err(err) if false \&\& known.is_some_and(/; s/\.recover_after\(known, &self\.settings\.address, &self\.cluster_id, None\)/.recover({ let _ = known; \&self.settings.address }, \&self.cluster_id)/|a cluster leader that lost to a later epoch claims again instead of following, as a single agent does: leaders fight (CTL-3, RFC 0002 §2)"
  "replica-applies-before-durable|crates/weir-control/src/plane/writer.rs|s/let bytes = LogStore::encode_record\(position\.epoch, seq, &record\);/let bytes = LogStore::encode_record(position.epoch, seq, \&record); let _ = self.records.send(DurableRecord { seq, epoch: position.epoch, entries: Arc::new(record.entries.clone()) });/|the leader streams a slot to followers when it is sealed, before it is durable: a replica shows what the log may never hold (CTL-2, RFC 0002 §3)"
  "stale-coordinator-commits|crates/weir-control/src/state/registry.rs|s/if registered\n            \&\& self\.coordinator\(group\) == Some\(stamp\.node_id\)\n            \&\& !self\.moved_since\(group, stamp\.node_id, stamp\.since\)/if true/|apply accepts an offset commit from an agent that is not (or no longer) the group's coordinator: the coordinator fence is off (GRP-1, RFC 0002 §7)"
  "coordinator-fence-ignores-since|crates/weir-control/src/state/registry.rs|s/\n            \&\& !self\.moved_since\(group, stamp\.node_id, stamp\.since\)//|the coordinator fence checks only that the stamp's agent is registered and coordinates the group now, not that it did so without a break since the stamp: a coordinator that lost the group and got it back commits an older generation's offsets (GRP-1, RFC 0002 §7)"
  "ack-on-reservation-only|crates/weir-produce/src/reserver.rs|s/tokio::time::timeout_at\(deadline, job\.upload\)\.await/{ drop(job.upload); Ok::<Result<UploadResult, oneshot::error::RecvError>, tokio::time::error::Elapsed>(Ok((Ok(vec![0]), job.sealed_at))) }/|parallel persistence acknowledges a file once its reservation is durable, without waiting for its upload to reach a quorum (DUR-1, RFC 0006)"
  "stable-hw-skips-pending|crates/weir-control/src/state.rs|s/first\.min\(state\.high_watermark\)(\s*\}\);)/let _ = first; state.high_watermark\$1/|the stable high watermark ignores pending batches: consumers read reserved files before they are confirmed, and batches later aborted (FET-1, RFC 0006)"
  "abort-young-file|crates/weir-produce/src/resolver.rs|s/> give_up_ms as i128/>= 0/|the resolver aborts a missing file at once, not after the ack deadline and the clock-skew margin: a writer that still runs may yet get its quorum and acknowledge it (DUR-1, RFC 0006)"
  "duplicate-of-pending-acks|crates/weir-control/src/state.rs|s/if pending\.is_some_and\(/if false \&\& pending.is_some_and(/|a retry of a pending batch is acknowledged as a duplicate with its original's offset, which may still be aborted (DUR-1, IDM-1, RFC 0006)"
  "cross-incarnation-unguarded|crates/weir-control/src/state.rs|s/owner\.agent != agent/false/|a batch of a producer whose latest batch is pending in another incarnation's file is appended instead of refused: an abort of that file rolls the producer's sequences back under it (IDM-1, RFC 0006)"
  "abort-without-suffix|crates/weir-control/src/state/pending.rs|s/let aborted: Vec<PendingFile> = suffix\.unwrap_or_default\(\)\.to_vec\(\);/let aborted: Vec<PendingFile> = suffix.unwrap_or_default().iter().take(1).cloned().collect();/|an abort takes only the first of the files it names and leaves its incarnation's later pending files, which the resolver may then confirm over rolled-back sequences (ORD-1, IDM-1, RFC 0006)"
  "serve-before-quorum|crates/weir-produce/src/reserver.rs|s/(weir_common::failpoint::hit\(weir_common::failpoint::AFTER_RESERVE_BEFORE_ACK\);)/\$1 control.serve_acknowledged(job.file_id, (0..3).collect());/|an agent serves a reserved file to its consumers once the reservation is durable, before its upload reached a quorum: consumers read batches that may be aborted (FET-1, RFC 0006)"
  "serve-unacknowledged|crates/weir-control/src/state/pending.rs|s/!acknowledged\(&owner\.file_id\)/false/|an agent serving its acknowledged files serves every pending file, its own unacknowledged ones and other incarnations' too (FET-1, RFC 0006)"
  "confirm-short-file|crates/weir-produce/src/resolver.rs|s/(let missing = holders\.len\(\) \+ unanswered < quorum;\s*)Whereabouts::Short \{[^}]*\}/\$1let _ = (absent, missing); Whereabouts::Quorum(holders)/|the resolver confirms a pending file found in fewer buckets than a quorum with the holders it found, without copying it to a quorum first: a confirmed file one bucket loss from gone (DUR-1, RFC 0006 repair)"
  "repair-claims-uncopied|crates/weir-produce/src/resolver.rs|s/match store\.put\(&key, PutPayload::from\(bytes\.clone\(\)\)\)\.await \{/match { let _ = (store, \&bytes); Ok::<(), object_store::Error>(()) } {/|the resolver's repair counts a bucket as holding the copy it was to write without writing it: the confirmation names a holder without the file (DUR-1, RFC 0006 repair)"
  "key-memo-wrong-entry|crates/weir-storage/src/keys.rs|s/return recent\[at\]\.2\.clone\(\);/return recent[0].2.clone();/|the data-file key memo answers a hit with its newest remembered key, not the one that matched: a read or write names another file's object (DUR-1, FET-1; issue 16 key memo)"
  "key-memo-same-millisecond|crates/weir-storage/src/keys.rs|s/\*t == tier && id == file_id\)/*t == tier \&\& id.unix_ms() == file_id.unix_ms())/|the data-file key memo matches a remembered key by tier and the id's millisecond, not the whole id: files sealed in the same millisecond share an object key (DUR-1, FET-1; issue 16 key memo)"
  "contiguous-part-misplaced|crates/weir-produce/src/uploader.rs|s/whole\.slice\(at - part\.len\(\)\.\.at\)/whole.slice(0..part.len())/|over in-process buckets the uploader caches every batch as the file's first bytes, not its own slice of the file copy: fetches served from the write-through cache return another batch's bytes (FET-1; issue 16 one-copy upload)"
  "ack-after-abandon|crates/weir-produce/src/reserver.rs|s/(if landed_at <= deadline => \{\s*)if incarnations\.current\(\)\.0 != generation \{/\$1if false \&\& incarnations.current().0 != generation {/|the acker answers a file whose upload finished after its incarnation was abandoned (a failed confirmation write, elsewhere): the agent's own resolver aborts missing files of abandoned incarnations at once, so such a file may be acknowledged and aborted (DUR-1, RFC 0006)"
  "expire-pending-producer|crates/weir-control/src/state/expiry.rs|s/ && !pending\.contains\(id\)//|a producer whose latest batch is pending expires: its retry is refused as an unknown id, the client bumps its epoch and appends the batch again while the original is confirmed (IDM-1, RFC 0006)"
  "follower-reads-unbounded|crates/weir-control/src/plane/freshness.rs|s/        view\.leading\n/        true\n/|a cluster follower serves fetch plans from its replica however long ago it last knew the replica whole: cut off its leader and the bucket, it plans reads of files the leader's deleter removed (GC-1, RFC 0002 §3; seed 1126)"
  "replica-restart-stops-at-snapshot|crates/weir-control/src/replica.rs|s/self\.apply_read\(gap, after\);/drop(after);/|a follower's replica that restarts from a replay installs the snapshot's state without the slots after it: for a tick it serves a state that may be older than the deleter's grace (GC-1; seed 724)"
  "gc-before-durable|crates/weir-control/src/plane/writer.rs|s/waiters.push\(\(reply, self.working.apply\(&entry\)\)\);/if matches!(entry, Entry::AdvanceLogStart { .. }) { self.state.write().unwrap().apply(\&entry); } waiters.push((reply, self.working.apply(\&entry)));/|a log start move reaches readers (the file deleter among them) when its slot is sealed, before it is durable: the deleter acts on the working state's releases (GC-1, RFC 0003 checks a and b)"
)

# Every tree is extracted with fresh mtimes. The trees share one target dir, and cargo names a
# workspace crate's artifacts by its path relative to the workspace root, so they are the same
# across trees. `git archive` would stamp every file with the commit time, older than the
# artifacts, so cargo would keep a crate built from an earlier tree: a mutation in weir-storage
# would then leak into every later mutant and into a re-run baseline (found 2026-12-01).
extract() {
    git archive HEAD | tar -x -m -C "$1"
}

wanted=("$@")
mkdir -p "$root"
summary=()
status=0

# The unmutated tree first: its seeds must all pass, or a mutant's failures prove nothing.
if [ ${#wanted[@]} -eq 0 ] || [[ " ${wanted[*]} " =~ " baseline " ]]; then
    tree="$root/baseline"
    rm -rf "$tree" && mkdir -p "$tree"
    extract "$tree"
    echo "== baseline: the committed tree, unmutated"
    (cd "$tree" && cargo build -q --release -p weir-sim)
    if "$CARGO_TARGET_DIR/release/weir-sim" --start "$start" --seeds "$seeds" >"$root/baseline.out" 2>&1; then
        summary+=("baseline: $(tail -n 1 "$root/baseline.out")")
    else
        summary+=("baseline FAILED: $(tail -n 1 "$root/baseline.out")")
        status=1
    fi
    echo "   $(tail -n 1 "$root/baseline.out")"
fi
for spec in "${MUTATIONS[@]}"; do
    IFS='|' read -r name file subst what <<<"$spec"
    if [ ${#wanted[@]} -gt 0 ] && [[ ! " ${wanted[*]} " =~ " $name " ]]; then continue; fi
    tree="$root/$name"
    rm -rf "$tree" && mkdir -p "$tree"
    extract "$tree"
    before=$(sha256sum "$tree/$file")
    perl -0pi -e "$subst" "$tree/$file"
    if [ "$(sha256sum "$tree/$file")" = "$before" ]; then
        echo "mutants: $name does not apply to $file any more: update tests/mutants/run.sh" >&2
        status=1
        summary+=("$name: DOES NOT APPLY")
        continue
    fi
    echo "== $name: $what"
    (cd "$tree" && cargo build -q --release -p weir-sim)
    out="$root/$name.out"
    if "$CARGO_TARGET_DIR/release/weir-sim" --start "$start" --seeds "$seeds" >"$out" 2>&1; then
        verdict="NOT CAUGHT"
        status=1
    else
        verdict="caught"
    fi
    line=$(tail -n 1 "$out")
    echo "   $verdict: $line"
    summary+=("$name $verdict: $line")
done
echo
echo "mutants (seeds $start..$((start + seeds - 1))):"
printf '  %s\n' "${summary[@]}"
exit $status
