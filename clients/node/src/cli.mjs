// A command-line client for an inference server, from Node.js, through the generated client.
//
//   node src/cli.mjs generate [options] PROMPT   stream a completion
//   node src/cli.mjs models [options]            list the models, as JSON
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
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import {
  ChatMessageSchema,
  GenerateRequestSchema,
  GenerationFinishedSchema,
  Inference,
  ListModelsRequestSchema,
  ListModelsResponseSchema,
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

const commands = { generate, models };
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
