// Package entitycheck reads an entity's settings through the Service Bus
// administration API and says which of them weaken the retry library's
// crash contract (README, "Crash contract" and "Recommended queue
// settings"):
//
//   - duplicate detection off on the entity retry copies are sent to: a
//     crash between scheduling a copy and completing the original can then
//     leave two copies of one attempt;
//   - a duplicate-detection window shorter than lock duration +
//     SettleTimeout + a handler allowance: the second send of such a copy
//     can come after the window, so it is not dropped;
//   - MaxDeliveryCount below 5: with this library redeliveries only follow
//     infrastructure faults (lost locks, dropped connections), and a low
//     limit dead-letters messages that never failed in a handler.
//
// It is internal so that the root package can call it at start-up and
// surface the warnings through its logger and Health; [Check] is the
// entry point.
package entitycheck
