// A grpc-web client, as a browser page makes one, run under Node.js: the same
// generated code as cli.mjs, over @connectrpc/connect-web's fetch transport (HTTP/1.1
// under Node), which speaks grpc-web rather than gRPC. The cluster's Envoy translates
// it (`make cluster`, its gRPC port); a replica alone speaks only gRPC.
//
//   node src/grpc-web.mjs --target HOST:PORT [--max-tokens N] PROMPT
//
// Prints one JSON line with the models (ListModels), then one per streamed event of a
// Generate of PROMPT: {"delta": TEXT} for each piece, then {"finished": {...}}. A failed
// call prints its status to stderr and exits 2.
import { parseArgs } from "node:util";
import { create, toJson } from "@bufbuild/protobuf";
import { ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcWebTransport } from "@connectrpc/connect-web";
import {
  GenerateRequestSchema,
  GenerationFinishedSchema,
  Inference,
} from "./gen/inference/v1/inference_pb.js";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    target: { type: "string", default: "127.0.0.1:50060" },
    "max-tokens": { type: "string", default: "8" },
  },
});

const transport = createGrpcWebTransport({ baseUrl: `http://${values.target}` });
const client = createClient(Inference, transport);

try {
  const { models } = await client.listModels({});
  console.log(JSON.stringify({ models: models.map((model) => model.name) }));
  const request = create(GenerateRequestSchema, {
    prompt: positionals.join(" ") || "Hello",
    maxTokens: Number(values["max-tokens"]),
    temperature: 0,
  });
  for await (const { event } of client.generate(request)) {
    if (event.case === "delta") console.log(JSON.stringify({ delta: event.value.text }));
    if (event.case === "finished") {
      console.log(JSON.stringify({ finished: toJson(GenerationFinishedSchema, event.value) }));
    }
  }
} catch (error) {
  const failure = ConnectError.from(error);
  console.error(`error: ${failure.code}: ${failure.rawMessage}`);
  process.exit(2);
}
