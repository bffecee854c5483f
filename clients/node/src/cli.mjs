// A command-line client for an inference server, from Node.js, through the generated client.
//
//   node src/cli.mjs generate [options] PROMPT   stream a completion
//   node src/cli.mjs models [options]            list the models, as JSON
//   node src/cli.mjs pull [--image] MODEL        download a hub model into the server's
//                                                cache (it needs --allow-pull): a progress
//                                                bar on stderr, the finished event as JSON
//
// Options: --target HOST:PORT, --model M, --max-tokens N, --temperature T, --chat,
// --token TOKEN (a bearer token), --ca FILE (TLS: the CA that signed the server's
// certificate), --cert FILE --key FILE (mTLS: this client's certificate), --request-id ID.
//
// `generate` prints the text as it streams, then one JSON line with the final event. The
// server's x-request-id goes to stderr. A failed call prints its gRPC status to stderr and
// exits 2.
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { create, toJson } from "@bufbuild/protobuf";
import cliProgress from "cli-progress";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import {
  Capability,
  ChatMessageSchema,
  GenerateRequestSchema,
  GenerationFinishedSchema,
  Inference,
  ListModelsRequestSchema,
  ListModelsResponseSchema,
  PullFinishedSchema,
  PullRequestSchema,
} from "./gen/inference/v1/inference_pb.js";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    target: { type: "string", default: "127.0.0.1:50051" },
    model: { type: "string", default: "" },
    prompt: { type: "string" },
    "max-tokens": { type: "string" },
    temperature: { type: "string" },
    chat: { type: "boolean", default: false },
    image: { type: "boolean", default: false },
    token: { type: "string" },
    ca: { type: "string" },
    cert: { type: "string" },
    key: { type: "string" },
    "request-id": { type: "string" },
  },
});
const [command = "generate", ...words] = positionals;

function connect() {
  const tls = values.ca !== undefined || values.cert !== undefined;
  const nodeOptions = {};
  if (values.ca !== undefined) nodeOptions.ca = readFileSync(values.ca);
  if (values.cert !== undefined) nodeOptions.cert = readFileSync(values.cert);
  if (values.key !== undefined) nodeOptions.key = readFileSync(values.key);
  const transport = createGrpcTransport({
    baseUrl: `${tls ? "https" : "http"}://${values.target}`,
    nodeOptions,
  });
  return createClient(Inference, transport);
}

function callOptions() {
  const headers = {};
  if (values.token !== undefined) headers.authorization = `Bearer ${values.token}`;
  if (values["request-id"] !== undefined) headers["x-request-id"] = values["request-id"];
  const onHeader = (received) => {
    const id = received.get("x-request-id");
    if (id) console.error(`x-request-id: ${id}`);
  };
  return { headers, onHeader };
}

async function generate(client) {
  const prompt = values.prompt ?? words.join(" ");
  const request = create(GenerateRequestSchema, { model: values.model });
  if (values.chat) {
    request.messages.push(create(ChatMessageSchema, { role: "user", content: prompt }));
  } else {
    request.prompt = prompt;
  }
  if (values["max-tokens"] !== undefined) request.maxTokens = Number(values["max-tokens"]);
  if (values.temperature !== undefined) request.temperature = Number(values.temperature);
  for await (const response of client.generate(request, callOptions())) {
    const event = response.event;
    if (event.case === "delta") process.stdout.write(event.value.text);
    if (event.case === "finished") {
      process.stdout.write("\n");
      console.log(JSON.stringify(toJson(GenerationFinishedSchema, event.value)));
    }
  }
}

async function models(client) {
  const reply = await client.listModels(create(ListModelsRequestSchema), callOptions());
  console.log(JSON.stringify(toJson(ListModelsResponseSchema, reply)));
}

async function pull(client) {
  const model = values.model || words.join(" ");
  const capability = values.image ? Capability.IMAGE : Capability.TEXT;
  const request = create(PullRequestSchema, { model, capability });
  let bar;
  let finished;
  try {
    for await (const response of client.pull(request, callOptions())) {
      const event = response.event;
      if (event.case === "started") bar = pullBar(model, event.value);
      if (event.case === "progress" && bar !== undefined) {
        const progress = event.value;
        bar.update(Number(progress.bytesDone), {
          file: progress.file,
          rate: megabytes(progress.bytesPerSecond),
        });
      }
      if (event.case === "finished") finished = event.value;
    }
  } finally {
    bar?.stop();
  }
  console.log(JSON.stringify(toJson(PullFinishedSchema, finished)));
  if (!finished.admit?.admitted) process.exitCode = 1;
}

function pullBar(model, started) {
  const download = started.download;
  const count = download.files.length;
  console.error(`pulling ${download.repo} at ${download.commit.slice(0, 12)}: ${count} file${count === 1 ? "" : "s"}`);
  const bar = new cliProgress.SingleBar(
    {
      format: `${model} |{bar}| {percentage}% | {value}/{total} bytes | {rate} MB/s | {file}`,
      stream: process.stderr,
      // Drawn when stderr is not a terminal too (a log, a CI job), every 2 s.
      noTTYOutput: true,
      hideCursor: true,
    },
    cliProgress.Presets.shades_classic,
  );
  bar.start(Number(download.totalBytes), Number(started.cachedBytes), { file: "", rate: "0.0" });
  return bar;
}

function megabytes(bytesPerSecond) {
  return (bytesPerSecond / 1e6).toFixed(1);
}

const commands = { generate, models, pull };
if (!(command in commands)) {
  console.error(`unknown command ${command}; use one of: ${Object.keys(commands).join(", ")}`);
  process.exit(64);
}
try {
  await commands[command](connect());
} catch (error) {
  const failure = ConnectError.from(error);
  console.error(`error: ${Code[failure.code]}: ${failure.rawMessage}`);
  process.exitCode = 2;
}
