"""Drives the Python SDK azure-servicebus through the operations the Go suite checks.

The connection string is argv[1] and the CA bundle that signs the emulator's TLS certificate
argv[2]. One JSON line per check goes to stdout: {"check": name, "ok": bool, "detail": text}.
Requests to the Go side are {"ask": "..."} lines answered by "ok" on stdin, so nothing here
waits on a clock.
"""
import datetime
import json
import sys
import traceback

from azure.servicebus import (
    NEXT_AVAILABLE_SESSION,
    ServiceBusClient,
    ServiceBusMessage,
    ServiceBusMessageState,
    ServiceBusReceiveMode,
    ServiceBusSubQueue,
)
from azure.servicebus.exceptions import (
    MessageLockLostError,
    MessageNotFoundError,
    MessageSizeExceededError,
    MessagingEntityNotFoundError,
    ServiceBusAuthenticationError,
    ServiceBusCommunicationError,
    SessionCannotBeLockedError,
)

CONNECTION_STRING, CA_BUNDLE = sys.argv[1], sys.argv[2]
WAIT = 5  # seconds a receive may wait for messages that are already there


def emit(**fields):
    print(json.dumps(fields), flush=True)


def ask(what):
    emit(ask=what)
    answer = sys.stdin.readline().strip()
    if answer != "ok":
        raise RuntimeError(f"the Go side answered {answer!r} to {what}")


def expect(cond, what):
    if not cond:
        raise AssertionError(f"expected {what}")


CHECKS = []


def check(name):
    def register(fn):
        CHECKS.append((name, fn))
        return fn
    return register


def body(msg):
    return b"".join(msg.body).decode()


@check("send, receive and complete")
def send_receive_complete(client):
    with client.get_queue_sender("py-queue") as sender:
        sender.send_messages(ServiceBusMessage("hello", message_id="m-1", application_properties={"n": 1}))
    with client.get_queue_receiver("py-queue", max_wait_time=WAIT) as receiver:
        [msg] = receiver.receive_messages(max_message_count=1, max_wait_time=WAIT)
        expect(body(msg) == "hello", f"body hello, got {body(msg)}")
        expect(msg.message_id == "m-1", "the message id")
        # Like the JavaScript SDK, this one reports the header's count of earlier deliveries.
        expect(msg.delivery_count == 0, f"delivery count 0, got {msg.delivery_count}")
        expect(msg.sequence_number is not None and msg.locked_until_utc is not None, "sequence number and lock")
        receiver.complete_message(msg)


@check("abandon redelivers with the delivery counted")
def abandon(client):
    with client.get_queue_sender("py-queue") as sender:
        sender.send_messages(ServiceBusMessage("again"))
    with client.get_queue_receiver("py-queue", max_wait_time=WAIT) as receiver:
        [first] = receiver.receive_messages(max_message_count=1, max_wait_time=WAIT)
        receiver.abandon_message(first)
        [second] = receiver.receive_messages(max_message_count=1, max_wait_time=WAIT)
        expect(body(second) == "again", "the abandoned message back")
        expect(second.delivery_count == 1, f"delivery count 1, got {second.delivery_count}")
        receiver.complete_message(second)


@check("dead-letter and read the dead-letter queue")
def dead_letter(client):
    with client.get_queue_sender("py-queue") as sender:
        sender.send_messages(ServiceBusMessage("poison"))
    with client.get_queue_receiver("py-queue", max_wait_time=WAIT) as receiver:
        [msg] = receiver.receive_messages(max_message_count=1, max_wait_time=WAIT)
        receiver.dead_letter_message(msg, reason="Bad", error_description="very bad")
    with client.get_queue_receiver("py-queue", sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=WAIT) as dlq:
        [dead] = dlq.receive_messages(max_message_count=1, max_wait_time=WAIT)
        expect(body(dead) == "poison", "the message in the dead-letter queue")
        expect(dead.dead_letter_reason == "Bad", f"reason Bad, got {dead.dead_letter_reason}")
        expect(dead.dead_letter_error_description == "very bad", "the description")
        expect(dead.dead_letter_source == "py-queue", f"the source, got {dead.dead_letter_source}")
        dlq.complete_message(dead)


@check("peek on an empty and on a full queue")
def peek(client):
    with client.get_queue_receiver("py-queue", max_wait_time=WAIT) as receiver:
        none = receiver.peek_messages(max_message_count=5)
        expect(len(none) == 0, f"nothing to peek, got {len(none)}")
        with client.get_queue_sender("py-queue") as sender:
            sender.send_messages([ServiceBusMessage(b) for b in ("p1", "p2", "p3")])
        peeked = receiver.peek_messages(max_message_count=10)
        expect([body(m) for m in peeked] == ["p1", "p2", "p3"], f"3 in order, got {[body(m) for m in peeked]}")
        msgs = receiver.receive_messages(max_message_count=3, max_wait_time=WAIT)
        for m in msgs:
            receiver.complete_message(m)
        expect(len(msgs) == 3, f"3 received, got {len(msgs)}")


@check("schedule and cancel")
def schedule(client):
    at = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)
    with client.get_queue_sender("py-queue") as sender:
        seqs = sender.schedule_messages([ServiceBusMessage("later"), ServiceBusMessage("cancelled")], at)
        expect(len(seqs) == 2, f"two sequence numbers, got {seqs}")
        sender.cancel_scheduled_messages(seqs[1])
        with client.get_queue_receiver("py-queue", max_wait_time=WAIT) as receiver:
            peeked = receiver.peek_messages(max_message_count=10)
            expect([body(m) for m in peeked] == ["later"], f"one scheduled left, got {[body(m) for m in peeked]}")
        sender.cancel_scheduled_messages(seqs[0])


@check("renew a lock, then lose it")
def renew_and_lose(client):
    with client.get_queue_sender("py-queue") as sender:
        sender.send_messages(ServiceBusMessage("slow"))
    with client.get_queue_receiver("py-queue", max_wait_time=WAIT) as receiver:
        [msg] = receiver.receive_messages(max_message_count=1, max_wait_time=WAIT)
        renewed = receiver.renew_message_lock(msg)
        expect(isinstance(renewed, datetime.datetime), "a new expiry")
        ask("expire-locks")
        # This SDK version settles on the receive link without waiting for the
        # outcome (uamqp), so a complete on a lock the broker expired may
        # return quietly; it raises only when the lock time it knows has
        # passed. Either way the broker refused it: the message comes back.
        try:
            receiver.complete_message(msg)
        except MessageLockLostError:
            pass
        [again] = receiver.receive_messages(max_message_count=1, max_wait_time=WAIT)
        expect(body(again) == "slow", f"the same message back, got {body(again)}")
        expect(again.delivery_count == 1, f"redelivered with the delivery counted, got {again.delivery_count}")
        receiver.complete_message(again)


@check("receive and delete")
def receive_and_delete(client):
    with client.get_queue_sender("py-queue") as sender:
        sender.send_messages(ServiceBusMessage("once"))
    with client.get_queue_receiver("py-queue", receive_mode=ServiceBusReceiveMode.RECEIVE_AND_DELETE, max_wait_time=WAIT) as receiver:
        [msg] = receiver.receive_messages(max_message_count=1, max_wait_time=WAIT)
        expect(body(msg) == "once", "the message")
        expect(len(receiver.peek_messages(max_message_count=5)) == 0, "nothing left")


@check("unknown entity is not found")
def not_found(client):
    try:
        with client.get_queue_receiver("no-such-queue", max_wait_time=WAIT) as receiver:
            receiver.receive_messages(max_message_count=1, max_wait_time=WAIT)
        raise AssertionError("receive from an unknown queue succeeded")
    except MessagingEntityNotFoundError:
        pass
    except ServiceBusCommunicationError as err:
        # uamqp raises a refused attach as LinkDetach, a connection error, and
        # this SDK version files amqp:not-found on a connection error under
        # ServiceBusCommunicationError (azure/servicebus/exceptions.py); the
        # condition is still not-found.
        expect("NotFound" in str(err), f"the not-found condition, got {err}")
    except ServiceBusAuthenticationError as err:
        # Service Bus answers the put-token for a missing entity 404 before
        # any link attaches (sbemu/cbs.go); this SDK version reports every
        # failed put-token as an authentication error, status and all.
        expect("404" in str(err) and "could not be found" in str(err), f"the put-token's 404, got {err}")


@check("a message over the size limit is refused")
def too_large(client):
    with client.get_queue_sender("py-queue") as sender:
        try:
            sender.send_messages(ServiceBusMessage("x" * (300 * 1024)))
            raise AssertionError("an oversized send succeeded")
        except MessageSizeExceededError:
            pass


@check("system properties round trip")
def properties(client):
    with client.get_queue_sender("py-queue") as sender:
        sender.send_messages(ServiceBusMessage(
            "props", message_id="props-1", correlation_id="corr-1", subject="order.created",
            content_type="text/plain", to="somewhere", reply_to="replies",
            time_to_live=datetime.timedelta(hours=1),
            application_properties={"s": "text", "i": 42, "b": True, "f": 1.5},
        ))
    with client.get_queue_receiver("py-queue", max_wait_time=WAIT) as receiver:
        [m] = receiver.receive_messages(max_message_count=1, max_wait_time=WAIT)
        for name, want in (("message_id", "props-1"), ("correlation_id", "corr-1"), ("subject", "order.created"),
                           ("content_type", "text/plain"), ("to", "somewhere"), ("reply_to", "replies"),
                           ("time_to_live", datetime.timedelta(hours=1))):
            expect(getattr(m, name) == want, f"{name} {want!r}, got {getattr(m, name)!r}")
        props = {k.decode() if isinstance(k, bytes) else k: (v.decode() if isinstance(v, bytes) else v)
                 for k, v in m.application_properties.items()}
        expect(props == {"s": "text", "i": 42, "b": True, "f": 1.5}, f"application properties, got {props}")
        expect(m.enqueued_time_utc is not None and m.expires_at_utc is not None, "enqueued and expiry times")
        receiver.complete_message(m)


@check("topic subscriptions with a rule")
def subscriptions(client):
    with client.get_topic_sender("py-topic") as sender:
        sender.send_messages([
            ServiceBusMessage("blue", application_properties={"color": "blue"}),
            ServiceBusMessage("red", application_properties={"color": "red"}),
        ])
    with client.get_subscription_receiver("py-topic", "all", max_wait_time=WAIT) as receiver:
        got = receiver.receive_messages(max_message_count=2, max_wait_time=WAIT)
        for m in got:
            receiver.complete_message(m)
        expect(sorted(body(m) for m in got) == ["blue", "red"], f"both in all, got {[body(m) for m in got]}")
    with client.get_subscription_receiver("py-topic", "blue", max_wait_time=WAIT) as receiver:
        [b] = receiver.receive_messages(max_message_count=1, max_wait_time=WAIT)
        expect(body(b) == "blue", "blue in the filtered subscription")
        receiver.dead_letter_message(b, reason="Sub")
    with client.get_subscription_receiver("py-topic", "blue", sub_queue=ServiceBusSubQueue.DEAD_LETTER, max_wait_time=WAIT) as dlq:
        [dead] = dlq.receive_messages(max_message_count=1, max_wait_time=WAIT)
        expect(dead.dead_letter_reason == "Sub", "the subscription's dead-letter queue")
        dlq.complete_message(dead)


@check("sessions: accept a session, FIFO within it, session state")
def sessions(client):
    with client.get_queue_sender("py-sessions") as sender:
        sender.send_messages([
            ServiceBusMessage("a1", session_id="session-a"),
            ServiceBusMessage("b1", session_id="session-b"),
            ServiceBusMessage("a2", session_id="session-a"),
            ServiceBusMessage("a3", session_id="session-a"),
        ])
    with client.get_queue_receiver("py-sessions", session_id="session-a", max_wait_time=WAIT) as receiver:
        session = receiver.session
        expect(session.session_id == "session-a", f"session id session-a, got {session.session_id}")
        got = []
        while len(got) < 3:
            msgs = receiver.receive_messages(max_message_count=3 - len(got), max_wait_time=WAIT)
            expect(msgs, f"session-a's messages keep coming, stopped at {got}")
            for m in msgs:
                expect(m.session_id == "session-a", f"only session-a's messages, got {m.session_id}")
                got.append(body(m))
                receiver.complete_message(m)
        expect(got == ["a1", "a2", "a3"], f"FIFO a1, a2, a3, got {got}")
        expect(session.get_state() is None, f"no state before one is set, got {session.get_state()!r}")
        session.set_state(b"step-3")
        expect(session.get_state() == b"step-3", f"the state back, got {session.get_state()!r}")
        expect(isinstance(session.renew_lock(), datetime.datetime), "a renewed session lock")
        try:
            with client.get_queue_receiver("py-sessions", session_id="session-a", max_wait_time=WAIT) as other:
                other.receive_messages(max_message_count=1, max_wait_time=WAIT)
            raise AssertionError("a second receiver accepted a locked session")
        except SessionCannotBeLockedError:
            pass
    with client.get_queue_receiver("py-sessions", session_id="session-a", max_wait_time=WAIT) as receiver:
        kept = receiver.session.get_state()
        expect(kept == b"step-3", f"the state survives the receiver, got {kept!r}")
        receiver.session.set_state(None)
    with client.get_queue_receiver("py-sessions", session_id=NEXT_AVAILABLE_SESSION, max_wait_time=WAIT) as receiver:
        expect(receiver.session.session_id == "session-b", f"the next session with messages is session-b, got {receiver.session.session_id}")
        [b1] = receiver.receive_messages(max_message_count=1, max_wait_time=WAIT)
        expect(body(b1) == "b1", f"b1, got {body(b1)}")
        receiver.complete_message(b1)


@check("defer, receive by sequence number, complete")
def deferral(client):
    with client.get_queue_sender("py-queue") as sender:
        sender.send_messages([ServiceBusMessage("deferred"), ServiceBusMessage("next")])
    with client.get_queue_receiver("py-queue", max_wait_time=WAIT) as receiver:
        [first] = receiver.receive_messages(max_message_count=1, max_wait_time=WAIT)
        expect(body(first) == "deferred", f"the first message, got {body(first)}")
        seq = first.sequence_number
        receiver.defer_message(first)
        [second] = receiver.receive_messages(max_message_count=1, max_wait_time=WAIT)
        expect(body(second) == "next", f"a deferred message is skipped, got {body(second)}")
        receiver.complete_message(second)
        [peeked] = receiver.peek_messages(max_message_count=1, sequence_number=seq)
        expect(peeked.state == ServiceBusMessageState.DEFERRED, f"peek shows it deferred, got {peeked.state!r}")
        [back] = receiver.receive_deferred_messages(sequence_numbers=[seq])
        expect(body(back) == "deferred", f"the deferred message by its sequence number, got {body(back)}")
        expect(back.sequence_number == seq, f"the same sequence number, got {back.sequence_number}")
        expect(back.delivery_count == 1, f"the deferral counted as a delivery, got {back.delivery_count}")
        receiver.complete_message(back)
        try:
            gone = receiver.receive_deferred_messages(sequence_numbers=[seq])
            raise AssertionError(f"a completed deferred message came back: {[body(m) for m in gone]}")
        except MessageNotFoundError:
            pass
        left = receiver.peek_messages(max_message_count=5)
        expect(not left, f"nothing left, got {[body(m) for m in left]}")


def main():
    with ServiceBusClient.from_connection_string(CONNECTION_STRING, connection_verify=CA_BUNDLE, retry_total=1) as client:
        for name, fn in CHECKS:
            try:
                fn(client)
                emit(check=name, ok=True, detail="")
            except Exception:  # every failure is a result, not the end of the run
                emit(check=name, ok=False, detail=" | ".join(traceback.format_exc().strip().splitlines()[-3:]))


if __name__ == "__main__":
    main()
