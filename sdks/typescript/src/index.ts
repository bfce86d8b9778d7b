/**
 * `@differently/sdk`: a fetch-based client for the Differently `/v1` API (Node >= 20 and
 * browsers, no runtime dependencies). Start with `new Differently({baseUrl, apiKey})`.
 */
export * from "./client.js";
export * from "./errors.js";
export * from "./models.js";
export { EventStream, type EventMessage, type EventsOptions, type PublicEventMessage, type PublicEventsOptions, type StatusEventsOptions } from "./events.js";
export {
  ExecStream,
  OutputChunk,
  type CollectedExec,
  type ExecEvent,
  type ExecLine,
  type ExecOptions,
  type ExecStreamOptions,
  type ExitEvent,
} from "./exec.js";
export {
  MAX_STDIN_PER_CALL,
  ProcessOutput,
  Processes,
  type ProcessOutputOptions,
  type StartProcessOptions,
} from "./processes.js";
export { Pty, type PtyOptions, type PtySignal, type WebSocketConstructor, type WebSocketLike } from "./pty.js";
export { Transport, type CallOptions, type ClientOptions } from "./http.js";
export { EVENT_DATA, MODELS, QUERY_PARAMS, type ModelSpec } from "./manifest.js";
export { ROUTES, type OperationId } from "./routes.js";
export { parseSse, type SseMessage } from "./sse.js";
export { parseFrames, type Frame } from "./frames.js";
export {
  signWebhook,
  verifyWebhook,
  WebhookVerificationError,
  type VerifyWebhookOptions,
  type WebhookHeaders,
} from "./webhook-signature.js";
