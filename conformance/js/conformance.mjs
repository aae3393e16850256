// Drives @azure/service-bus through the operations the Go suite checks, against an
// emulator whose connection string is argv[2]. It prints one JSON line per check:
// {"check": name, "ok": bool, "detail": text}. It asks the Go side for help on stdout
// with {"ask": "..."} and waits for a line on stdin, so nothing here waits on a clock.
import { ServiceBusClient, isServiceBusError } from "@azure/service-bus";
import { createInterface } from "node:readline";

const connectionString = process.argv[2];
const lines = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

async function ask(what) {
  console.log(JSON.stringify({ ask: what }));
  const { value } = await lines.next();
  if (value !== "ok") throw new Error(`the Go side answered ${value} to ${what}`);
}

function report(check, ok, detail = "") {
  console.log(JSON.stringify({ check, ok, detail: String(detail) }));
}

async function run(check, fn) {
  try {
    await fn();
    report(check, true);
  } catch (err) {
    report(check, false, err && err.stack ? err.stack.split("\n").slice(0, 3).join(" | ") : err);
  }
}

function expect(cond, what) {
  if (!cond) throw new Error(`expected ${what}`);
}

function code(err) {
  return isServiceBusError(err) ? err.code : `${err && err.name}: ${err && err.message}`;
}

const client = new ServiceBusClient(connectionString, {
  retryOptions: { maxRetries: 1, retryDelayInMs: 20, maxRetryDelayInMs: 50, timeoutInMs: 10000 },
});
const wait = { maxWaitTimeInMs: 5000 };

try {
  await run("send, receive and complete", async () => {
    const sender = client.createSender("js-queue");
    await sender.sendMessages({ body: "hello", messageId: "m-1", applicationProperties: { n: 1 } });
    const receiver = client.createReceiver("js-queue");
    const [msg] = await receiver.receiveMessages(1, wait);
    expect(msg && msg.body === "hello", `body "hello", got ${msg && msg.body}`);
    expect(msg.applicationProperties.n === 1, "application property n = 1");
    // The JavaScript SDK reports the header's count of earlier deliveries (the
    // Go and .NET SDKs add one): 0 on the first delivery.
    expect(msg.deliveryCount === 0, `delivery count 0, got ${msg.deliveryCount}`);
    expect(typeof msg.sequenceNumber === "object" || typeof msg.sequenceNumber === "number", "a sequence number");
    expect(msg.lockedUntilUtc instanceof Date, "lockedUntilUtc");
    await receiver.completeMessage(msg);
    await sender.close();
    await receiver.close();
  });

  await run("abandon redelivers with the delivery counted", async () => {
    const sender = client.createSender("js-queue");
    await sender.sendMessages({ body: "again" });
    const receiver = client.createReceiver("js-queue");
    const [first] = await receiver.receiveMessages(1, wait);
    await receiver.abandonMessage(first, { reason: "retry" });
    const [second] = await receiver.receiveMessages(1, wait);
    expect(second && second.body === "again", "the abandoned message back");
    expect(second.deliveryCount === 1, `delivery count 1, got ${second.deliveryCount}`);
    expect(second.applicationProperties.reason === "retry", "properties to modify applied");
    await receiver.completeMessage(second);
    await receiver.close();
    await sender.close();
  });

  await run("dead-letter and read the dead-letter queue", async () => {
    const sender = client.createSender("js-queue");
    await sender.sendMessages({ body: "poison" });
    const receiver = client.createReceiver("js-queue");
    const [msg] = await receiver.receiveMessages(1, wait);
    await receiver.deadLetterMessage(msg, { deadLetterReason: "Bad", deadLetterErrorDescription: "very bad" });
    const dlq = client.createReceiver("js-queue", { subQueueType: "deadLetter" });
    const [dead] = await dlq.receiveMessages(1, wait);
    expect(dead && dead.body === "poison", "the message in the dead-letter queue");
    expect(dead.deadLetterReason === "Bad", `reason Bad, got ${dead.deadLetterReason}`);
    expect(dead.deadLetterErrorDescription === "very bad", "the description");
    expect(dead.deadLetterSource === "js-queue", `dead-letter source, got ${dead.deadLetterSource}`);
    await dlq.completeMessage(dead);
    await dlq.close();
    await receiver.close();
    await sender.close();
  });

  await run("peek on an empty and on a full queue", async () => {
    const receiver = client.createReceiver("js-queue");
    const none = await receiver.peekMessages(5);
    expect(none.length === 0, `nothing to peek, got ${none.length}`);
    const sender = client.createSender("js-queue");
    await sender.sendMessages([{ body: "p1" }, { body: "p2" }, { body: "p3" }]);
    const peeked = await receiver.peekMessages(10);
    expect(peeked.length === 3, `3 peeked, got ${peeked.length}`);
    expect(peeked.map((m) => m.body).join() === "p1,p2,p3", "in order");
    const msgs = await receiver.receiveMessages(3, wait);
    for (const m of msgs) await receiver.completeMessage(m);
    expect(msgs.length === 3, `3 received, got ${msgs.length}`);
    await sender.close();
    await receiver.close();
  });

  await run("schedule and cancel", async () => {
    const sender = client.createSender("js-queue");
    const at = new Date(Date.now() + 3600 * 1000);
    const seqs = await sender.scheduleMessages([{ body: "later" }, { body: "cancelled" }], at);
    expect(seqs.length === 2, `two sequence numbers, got ${seqs.length}`);
    await sender.cancelScheduledMessages(seqs[1]);
    const receiver = client.createReceiver("js-queue");
    const peeked = await receiver.peekMessages(10);
    expect(peeked.length === 1 && peeked[0].body === "later", `one scheduled left, got ${peeked.length}`);
    expect(peeked[0].state === "scheduled", `state scheduled, got ${peeked[0].state}`);
    await sender.cancelScheduledMessages(seqs[0]);
    await sender.close();
    await receiver.close();
  });

  await run("renew a lock, then lose it", async () => {
    const sender = client.createSender("js-queue");
    await sender.sendMessages({ body: "slow" });
    const receiver = client.createReceiver("js-queue");
    const [msg] = await receiver.receiveMessages(1, wait);
    const renewed = await receiver.renewMessageLock(msg);
    expect(renewed instanceof Date, "a new expiry");
    await ask("expire-locks");
    try {
      await receiver.completeMessage(msg);
      throw new Error("complete after the lock expired succeeded");
    } catch (err) {
      expect(code(err) === "MessageLockLost", `MessageLockLost, got ${code(err)}`);
    }
    const [again] = await receiver.receiveMessages(1, wait);
    expect(again && again.deliveryCount === 1, `redelivered with the delivery counted, got ${again && again.deliveryCount}`);
    await receiver.completeMessage(again);
    await sender.close();
    await receiver.close();
  });

  await run("receive and delete", async () => {
    const sender = client.createSender("js-queue");
    await sender.sendMessages({ body: "once" });
    const receiver = client.createReceiver("js-queue", { receiveMode: "receiveAndDelete" });
    const [msg] = await receiver.receiveMessages(1, wait);
    expect(msg && msg.body === "once", "the message");
    const left = await receiver.peekMessages(5);
    expect(left.length === 0, `nothing left, got ${left.length}`);
    await sender.close();
    await receiver.close();
  });

  await run("unknown entity is not found", async () => {
    const receiver = client.createReceiver("no-such-queue");
    try {
      await receiver.receiveMessages(1, wait);
      throw new Error("receive from an unknown queue succeeded");
    } catch (err) {
      expect(code(err) === "MessagingEntityNotFound", `MessagingEntityNotFound, got ${code(err)}`);
    } finally {
      await receiver.close();
    }
  });

  await run("a message over the size limit is refused", async () => {
    const sender = client.createSender("js-queue");
    try {
      await sender.sendMessages({ body: "x".repeat(300 * 1024) });
      throw new Error("an oversized send succeeded");
    } catch (err) {
      expect(code(err) === "MessageSizeExceeded", `MessageSizeExceeded, got ${code(err)}`);
    } finally {
      await sender.close();
    }
  });

  await run("system properties round trip", async () => {
    const sender = client.createSender("js-queue");
    await sender.sendMessages({
      body: { kind: "json" },
      messageId: "props-1",
      correlationId: "corr-1",
      subject: "order.created",
      contentType: "application/json",
      to: "somewhere",
      replyTo: "replies",
      timeToLive: 60 * 60 * 1000,
      applicationProperties: { s: "text", i: 42, b: true, f: 1.5 },
    });
    const receiver = client.createReceiver("js-queue");
    const [m] = await receiver.receiveMessages(1, wait);
    expect(m && m.body && m.body.kind === "json", "a JSON body back");
    for (const [k, want] of Object.entries({
      messageId: "props-1", correlationId: "corr-1", subject: "order.created",
      contentType: "application/json", to: "somewhere", replyTo: "replies", timeToLive: 3600000,
    })) {
      expect(m[k] === want, `${k} ${want}, got ${m[k]}`);
    }
    const p = m.applicationProperties;
    expect(p.s === "text" && p.i === 42 && p.b === true && p.f === 1.5, `application properties, got ${JSON.stringify(p)}`);
    expect(m.enqueuedTimeUtc instanceof Date && m.expiresAtUtc instanceof Date, "enqueued and expiry times");
    await receiver.completeMessage(m);
    await receiver.close();
    await sender.close();
  });

  await run("a thousand and more messages through one link", async () => {
    const sender = client.createSender("js-queue");
    const n = 1500; // above the emulator's link credit of 1000
    for (let i = 0; i < n; i += 250) {
      const batch = await sender.createMessageBatch();
      for (let j = i; j < i + 250; j++) expect(batch.tryAddMessage({ body: `m${j}` }), "room in the batch");
      await sender.sendMessages(batch);
    }
    const receiver = client.createReceiver("js-queue", { receiveMode: "receiveAndDelete" });
    const seen = new Set();
    while (seen.size < n) {
      const msgs = await receiver.receiveMessages(500, wait);
      expect(msgs.length > 0, `messages keep coming, stopped at ${seen.size}`);
      for (const m of msgs) seen.add(m.body);
    }
    expect(seen.size === n, `${n} distinct, got ${seen.size}`);
    await receiver.close();
    await sender.close();
  });

  await run("schedule and cancel on a topic", async () => {
    const sender = client.createSender("js-topic");
    const at = new Date(Date.now() + 3600 * 1000);
    const [seq] = await sender.scheduleMessages({ body: "later" }, at);
    await sender.cancelScheduledMessages(seq);
    const receiver = client.createReceiver("js-topic", "all");
    const peeked = await receiver.peekMessages(5);
    expect(peeked.length === 0, `a cancelled topic message never reaches a subscription, got ${peeked.length}`);
    await receiver.close();
    await sender.close();
  });

  await run("topic subscriptions with a rule", async () => {
    const sender = client.createSender("js-topic");
    await sender.sendMessages([
      { body: "blue", applicationProperties: { color: "blue" } },
      { body: "red", applicationProperties: { color: "red" } },
    ]);
    const all = client.createReceiver("js-topic", "all");
    const got = await all.receiveMessages(2, wait);
    for (const m of got) await all.completeMessage(m);
    expect(got.map((m) => m.body).sort().join() === "blue,red", `both in "all", got ${got.map((m) => m.body)}`);
    const blue = client.createReceiver("js-topic", "blue");
    const [b] = await blue.receiveMessages(1, wait);
    expect(b && b.body === "blue", "blue in the filtered subscription");
    await blue.deadLetterMessage(b, { deadLetterReason: "Sub" });
    const dlq = client.createReceiver("js-topic", "blue", { subQueueType: "deadLetter" });
    const [dead] = await dlq.receiveMessages(1, wait);
    expect(dead && dead.deadLetterReason === "Sub", "the subscription's dead-letter queue");
    await dlq.completeMessage(dead);
    for (const r of [all, blue, dlq, sender]) await r.close();
  });
  await run("sessions: accept a session, FIFO within it, session state", async () => {
    const sender = client.createSender("js-sessions");
    await sender.sendMessages([
      { body: "a1", sessionId: "session-a" },
      { body: "b1", sessionId: "session-b" },
      { body: "a2", sessionId: "session-a" },
      { body: "a3", sessionId: "session-a" },
    ]);
    const a = await client.acceptSession("js-sessions", "session-a");
    expect(a.sessionId === "session-a", `session id session-a, got ${a.sessionId}`);
    expect(a.sessionLockedUntilUtc instanceof Date && a.sessionLockedUntilUtc > new Date(), `a session lock in the future, got ${a.sessionLockedUntilUtc}`);
    const got = [];
    while (got.length < 3) {
      const msgs = await a.receiveMessages(3 - got.length, wait);
      expect(msgs.length > 0, `session-a's messages keep coming, stopped at ${got.length}`);
      for (const m of msgs) {
        expect(m.sessionId === "session-a", `only session-a's messages, got ${m.sessionId}`);
        got.push(m.body);
        await a.completeMessage(m);
      }
    }
    expect(got.join() === "a1,a2,a3", `FIFO a1,a2,a3, got ${got}`);
    expect((await a.getSessionState()) === undefined || (await a.getSessionState()) === null, "no state before one is set");
    await a.setSessionState({ step: 3, done: ["a1", "a2", "a3"] });
    const state = await a.getSessionState();
    expect(state && state.step === 3 && state.done.join() === "a1,a2,a3", `the state back, got ${JSON.stringify(state)}`);
    const renewed = await a.renewSessionLock();
    expect(renewed instanceof Date, "a renewed session lock");
    try {
      await client.acceptSession("js-sessions", "session-a");
      throw new Error("a second receiver accepted a locked session");
    } catch (err) {
      expect(code(err) === "SessionCannotBeLocked", `SessionCannotBeLocked, got ${code(err)}`);
    }
    await a.close();
    const again = await client.acceptSession("js-sessions", "session-a");
    const kept = await again.getSessionState();
    expect(kept && kept.step === 3, `the state survives the receiver, got ${JSON.stringify(kept)}`);
    await again.setSessionState(null);
    await again.close();
    const next = await client.acceptNextSession("js-sessions");
    expect(next.sessionId === "session-b", `the next session with messages is session-b, got ${next.sessionId}`);
    const [b1] = await next.receiveMessages(1, wait);
    expect(b1 && b1.body === "b1", `b1, got ${b1 && b1.body}`);
    await next.completeMessage(b1);
    await next.close();
    await sender.close();
  });

  await run("defer, receive by sequence number, complete", async () => {
    const sender = client.createSender("js-queue");
    await sender.sendMessages([{ body: "deferred" }, { body: "next" }]);
    const receiver = client.createReceiver("js-queue");
    const [first] = await receiver.receiveMessages(1, wait);
    expect(first && first.body === "deferred", `the first message, got ${first && first.body}`);
    const seq = first.sequenceNumber;
    await receiver.deferMessage(first);
    const [second] = await receiver.receiveMessages(1, wait);
    expect(second && second.body === "next", `a deferred message is skipped, got ${second && second.body}`);
    await receiver.completeMessage(second);
    const [peeked] = await receiver.peekMessages(1, { fromSequenceNumber: seq });
    expect(peeked && peeked.state === "deferred", `peek shows it deferred, got ${peeked && peeked.state}`);
    const [back] = await receiver.receiveDeferredMessages(seq);
    expect(back && back.body === "deferred", `the deferred message by its sequence number, got ${back && back.body}`);
    expect(back.sequenceNumber.equals(seq), "the same sequence number");
    expect(back.deliveryCount === 1, `the deferral counted as a delivery, got ${back.deliveryCount}`);
    await receiver.completeMessage(back);
    const none = await receiver.receiveDeferredMessages(seq).then(
      (msgs) => `got ${msgs.length}`,
      (err) => code(err),
    );
    expect(none === "MessageNotFound", `a completed deferred message is gone (MessageNotFound), got ${none}`);
    const left = await receiver.peekMessages(5);
    expect(left.length === 0, `nothing left, got ${left.length}`);
    await receiver.close();
    await sender.close();
  });
} finally {
  await client.close();
  lines.return?.();
  process.stdin.destroy();
}
