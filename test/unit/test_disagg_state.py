"""KVSenderState / KVReceiverState with fake time: happy paths, timeouts, aborts, failures."""

from __future__ import annotations

import pytest
from sglang_pd.disaggregation.messages import Abort, AbortAck
from sglang_pd.disaggregation.receiver_state import KVReceiverState, ReceiverPhase
from sglang_pd.disaggregation.sender_state import KVSenderState, SenderPhase
from sglang_pd.disaggregation.state import Failure


def receiver(**kw: float) -> KVReceiverState:
    return KVReceiverState(
        room=7, created_at=100.0, bootstrap_timeout=10, waiting_timeout=20, abort_grace=5, **kw
    )


def sender(**kw: float) -> KVSenderState:
    return KVSenderState(room=7, created_at=100.0, bootstrap_timeout=10, waiting_timeout=20, **kw)


# ---- decode side ---------------------------------------------------------------------------


def test_receiver_happy_path_chunks_in_any_order() -> None:
    r = receiver()
    assert r.phase is ReceiverPhase.BOOTSTRAPPING and not r.pages_releasable(100)
    assert r.on_ack(101)
    assert r.phase is ReceiverPhase.WAITING_FOR_INPUT
    assert r.on_kv_notif(102, chunk=2, last=True)  # last chunk overtakes earlier ones
    assert r.phase is ReceiverPhase.TRANSFERRING
    r.on_kv_notif(103, chunk=0, last=False)
    assert r.phase is ReceiverPhase.TRANSFERRING
    r.on_kv_notif(104, chunk=1, last=False)
    assert r.phase is ReceiverPhase.SUCCESS and r.pages_releasable(104)
    assert r.take_outbox() == []
    assert not r.check_timeouts(10_000)  # finished states never time out


def test_receiver_notif_before_ack_implies_ack() -> None:
    r = receiver()
    r.on_kv_notif(101, chunk=0, last=True)
    assert r.phase is ReceiverPhase.SUCCESS
    assert not r.on_ack(102)  # late ack is ignored
    assert r.phase is ReceiverPhase.SUCCESS


def test_receiver_bootstrap_timeout_quarantines_pages_and_tells_prefill() -> None:
    r = receiver()
    assert not r.check_timeouts(110.0)  # exactly at the limit: not yet
    assert r.check_timeouts(110.5)
    assert r.phase is ReceiverPhase.FAILED and r.failure is Failure.BOOTSTRAP_TIMEOUT
    assert "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT" in r.reason
    assert r.take_outbox() == [Abort(room=7, reason=r.reason)]
    assert not r.pages_releasable(111)  # prefill might still write
    assert r.pages_releasable(115.5)  # abort_grace elapsed


def test_receiver_waiting_timeout_restarts_on_progress() -> None:
    r = receiver()
    r.on_ack(101)
    assert not r.check_timeouts(120)
    r.on_kv_notif(120, chunk=0, last=False)
    assert not r.check_timeouts(139)  # progress at 120 resets the clock
    assert r.check_timeouts(140.5)
    assert r.failure is Failure.WAITING_TIMEOUT and "chunks [0]" in r.reason


def test_receiver_local_abort_waits_for_abort_ack() -> None:
    r = receiver()
    r.on_ack(101)
    assert r.abort(102, "client disconnected")
    assert r.failure is Failure.ABORTED_LOCAL
    assert r.take_outbox() == [Abort(room=7, reason="client disconnected")]
    assert not r.pages_releasable(103)
    assert r.on_abort_ack(103)
    assert r.pages_releasable(103)
    assert not r.abort(104, "again")  # idempotent
    assert r.take_outbox() == []


def test_receiver_refused_and_remote_abort_free_pages_at_once() -> None:
    r = receiver()
    assert r.on_refused(101, "KV layout mismatch (page_size: ...)")
    assert r.failure is Failure.REFUSED and r.pages_releasable(101) and r.take_outbox() == []
    r2 = receiver()
    r2.on_ack(101)
    assert r2.on_remote_abort(102, "prefill OOM")
    assert r2.failure is Failure.ABORTED_REMOTE and "prefill OOM" in r2.reason
    assert r2.pages_releasable(102) and r2.take_outbox() == []


def test_receiver_peer_dead_ends_quarantine() -> None:
    r = receiver()
    r.on_ack(101)
    r.abort(102, "cancel")
    assert not r.pages_releasable(103)
    r.on_peer_dead(103, "prefill missed 2 heartbeats")
    assert r.pages_releasable(103) and r.failure is Failure.ABORTED_LOCAL
    r2 = receiver()
    assert r2.on_peer_dead(101, "gone")
    assert r2.failure is Failure.PEER_DEAD and r2.pages_releasable(101)


def test_receiver_ignores_events_after_finish() -> None:
    r = receiver()
    r.on_kv_notif(101, chunk=0, last=True)
    assert not r.on_kv_notif(102, chunk=1, last=False)
    assert not r.on_refused(102, "x") and not r.on_remote_abort(102, "x")
    assert r.phase is ReceiverPhase.SUCCESS


# ---- prefill side --------------------------------------------------------------------------


def test_sender_happy_path_with_chunks() -> None:
    s = sender()
    assert s.phase is SenderPhase.WAITING_FOR_DECODE and not s.bootstrapped and not s.can_send()
    assert s.on_register(101, num_dst_pages=4)
    assert s.bootstrapped and s.can_send() and s.check_num_pages(101, 4)
    s.on_transfer_started(102, chunk=0, last=False)
    s.on_transfer_started(102, chunk=1, last=True)
    assert s.phase is SenderPhase.TRANSFERRING and not s.can_send()
    assert not s.on_transfer_done(103, chunk=1)
    assert s.on_transfer_done(104, chunk=0)
    assert s.phase is SenderPhase.DONE and s.take_outbox() == []
    assert not s.on_register(105, 4)


def test_sender_cannot_post_before_register_or_after_last() -> None:
    s = sender()
    with pytest.raises(RuntimeError, match="cannot start chunk 0 in phase WaitingForDecode"):
        s.on_transfer_started(101, chunk=0, last=True)
    s.on_register(101, 1)
    s.on_transfer_started(101, chunk=0, last=True)
    with pytest.raises(RuntimeError, match="last_started=True"):
        s.on_transfer_started(101, chunk=1, last=True)


def test_sender_bootstrap_timeout_only_before_register() -> None:
    s = sender()
    assert s.check_timeouts(110.5)
    assert s.failure is Failure.BOOTSTRAP_TIMEOUT and s.take_outbox() == []
    s2 = sender()
    s2.on_register(101, 2)
    assert not s2.check_timeouts(1000)  # waiting for our own prefill compute: no timeout


def test_sender_page_count_mismatch_refuses_and_tells_decode() -> None:
    s = sender()
    s.on_register(101, num_dst_pages=3)
    assert not s.check_num_pages(101, 4)
    assert s.failure is Failure.REFUSED and "3 destination pages but prefill holds 4" in s.reason
    assert s.take_outbox() == [Abort(room=7, reason=s.reason)]


def test_sender_decode_abort_waits_for_in_flight_then_acks() -> None:
    s = sender()
    s.on_register(101, 2)
    s.on_transfer_started(102, chunk=0, last=True)
    assert s.on_abort(103, "client gone")
    assert s.phase is SenderPhase.TRANSFERRING and not s.can_send()
    assert s.take_outbox() == []  # a write is still in flight: no ack yet
    assert s.on_transfer_done(104, chunk=0)
    assert s.phase is SenderPhase.FAILED and s.failure is Failure.ABORTED_REMOTE
    assert s.take_outbox() == [AbortAck(room=7)]


def test_sender_abort_when_idle_or_finished_acks_immediately() -> None:
    s = sender()
    s.on_register(101, 2)
    s.on_abort(102, "x")
    assert s.take_outbox() == [AbortAck(room=7)]
    done = sender()
    done.on_register(101, 1)
    done.on_transfer_started(101, 0, True)
    done.on_transfer_done(102, 0)
    assert not done.on_abort(103, "late")
    assert done.phase is SenderPhase.DONE and done.take_outbox() == [AbortAck(room=7)]


def test_sender_transfer_error_and_peer_dead() -> None:
    s = sender()
    s.on_register(101, 2)
    s.on_transfer_started(102, chunk=0, last=True)
    assert s.on_transfer_error(103, chunk=0, reason="NIXL_ERR_REMOTE_DISCONNECT")
    assert s.failure is Failure.TRANSFER_ERROR and "chunk 0" in s.reason and s.take_outbox() == []
    s2 = sender()
    s2.on_register(101, 2)
    assert s2.on_peer_dead(102, "decode silent")
    assert s2.failure is Failure.PEER_DEAD


def test_sender_stuck_transfer_times_out_and_local_abort_rules() -> None:
    s = sender()
    s.on_register(101, 2)
    s.on_transfer_started(102, chunk=0, last=True)
    with pytest.raises(RuntimeError, match="release in-flight chunks"):
        s.abort(103, "cancelled")
    assert not s.check_timeouts(122)
    assert s.check_timeouts(122.5)
    assert s.failure is Failure.WAITING_TIMEOUT
    assert [type(x) for x in s.take_outbox()] == [Abort]
    s2 = sender()
    assert s2.abort(101, "cancelled") and s2.take_outbox() == []  # decode never registered
    s3 = sender()
    s3.on_register(101, 2)
    assert s3.abort(102, "cancelled") and s3.take_outbox() == [Abort(room=7, reason="cancelled")]
