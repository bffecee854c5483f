// Stream a completion from an inference server, from Node.js, through the generated client.
//
//   node src/generate.mjs [--target HOST:PORT] [--model M] [--max-tokens N] [--chat] PROMPT
//
// Prints the text as it streams, then one JSON line with the final event.
import { parseArgs } from "node:util";
import { create, toJson } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import {
  ChatMessageSchema,
  GenerateRequestSchema,
  GenerationFinishedSchema,
  Inference,
} from "./gen/inference/v1/inference_pb.js";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    target: { type: "string", default: "127.0.0.1:50051" },
    model: { type: "string", default: "" },
    "max-tokens": { type: "string" },
    temperature: { type: "string" },
    chat: { type: "boolean", default: false },
  },
});
const prompt = positionals.join(" ");

const request = create(GenerateRequestSchema, { model: values.model });
if (values.chat) {
  request.messages.push(create(ChatMessageSchema, { role: "user", content: prompt }));
} else {
  request.prompt = prompt;
}
if (values["max-tokens"] !== undefined) request.maxTokens = Number(values["max-tokens"]);
if (values.temperature !== undefined) request.temperature = Number(values.temperature);

const transport = createGrpcTransport({ baseUrl: `http://${values.target}` });
const client = createClient(Inference, transport);

try {
  for await (const response of client.generate(request)) {
    const event = response.event;
    if (event.case === "delta") process.stdout.write(event.value.text);
    if (event.case === "finished") {
      process.stdout.write("\n");
      console.log(JSON.stringify(toJson(GenerationFinishedSchema, event.value)));
    }
  }
} catch (error) {
  const failure = ConnectError.from(error);
  console.error(`error: ${Code[failure.code]}: ${failure.rawMessage}`);
  process.exitCode = 2;
}
