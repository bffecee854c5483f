// A command-line client for an inference server, from Node.js, through the generated client.
//
//   node src/cli.mjs generate [options] PROMPT   stream a completion
//   node src/cli.mjs models [options]            list the models, as JSON
//   node src/cli.mjs embed TEXT [TEXT...]        embed the texts together: one JSON line per
//                                                text (its vector and tokens), a summary on
//                                                stderr
//   node src/cli.mjs pull [--image] MODEL        download a hub model into the server's
//                                                cache (it needs --allow-pull): a progress
//                                                bar on stderr, the finished event as JSON
//   node src/cli.mjs pull --dry-run MODEL        what a pull would fetch (Admit, no weight
//                                                bytes move): the commit, the files and
//                                                their sizes, whether they fit on disk, the
//                                                repo's GGUF choices; exits 1 if refused
//   node src/cli.mjs cache list [--json]         the server's hub cache, a table (alias:
//                                                cache ls); --json: the reply as JSON
//   node src/cli.mjs cache delete MODEL          remove owner/name, one revision (@REV) or one file (:FILE)
//                                                (owner/name@REV), from the hub cache (it
//                                                needs --allow-pull)
//
// Options: --target HOST:PORT, --model M, --max-tokens N, --temperature T, --chat,
// --token TOKEN (a bearer token), --ca FILE (TLS: the CA that signed the server's
// certificate), --cert FILE --key FILE (mTLS: this client's certificate), --request-id ID.
//
// `generate` prints the text as it streams, then one JSON line with the final event; when
// the server pulls the model first (--pull-on-demand), a progress bar on stderr ends before
// the text starts. The server's x-request-id goes to stderr. A failed call prints its gRPC
// status to stderr and exits 2.
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { create, toJson } from "@bufbuild/protobuf";
import cliProgress from "cli-progress";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import {
  AdmitRequestSchema,
  Capability,
  ChatMessageSchema,
  DeleteCachedRequestSchema,
  EmbedInputSchema,
  EmbedRequestSchema,
  GenerateRequestSchema,
  GenerationFinishedSchema,
  Inference,
  ListCachedRequestSchema,
  ListCachedResponseSchema,
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
    "dry-run": { type: "boolean", default: false },
    json: { type: "boolean", default: false },
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
  // With --pull-on-demand the server may pull the model first: a bar, done before any text.
  let bar;
  try {
    for await (const response of client.generate(request, callOptions())) {
      const event = response.event;
      if (event.case === "pullProgress") {
        const progress = event.value;
        if (bar === undefined) {
          const label = request.model || "the default model";
          console.error(`pulling ${label} before generating`);
          bar = progressBar(label, Number(progress.bytesTotal), Number(progress.bytesDone));
        }
        bar.setTotal(Number(progress.bytesTotal));
        bar.update(Number(progress.bytesDone), {
          file: progress.file,
          rate: megabytes(progress.bytesPerSecond),
        });
        continue;
      }
      if (bar !== undefined) {
        bar.stop();
        bar = undefined;
      }
      if (event.case === "started" && event.value.pullMs > 0n) {
        const { pullMs, pulledBytes } = event.value;
        const seconds = (Number(pullMs) / 1000).toFixed(1);
        console.error(`pulled ${humanBytes(pulledBytes)} in ${seconds} s`);
      }
      if (event.case === "delta") process.stdout.write(event.value.text);
      if (event.case === "finished") {
        process.stdout.write("\n");
        console.log(JSON.stringify(toJson(GenerationFinishedSchema, event.value)));
      }
    }
  } finally {
    bar?.stop();
  }
}

async function models(client) {
  const reply = await client.listModels(create(ListModelsRequestSchema), callOptions());
  console.log(JSON.stringify(toJson(ListModelsResponseSchema, reply)));
}

async function embed(client) {
  const texts = words;
  const request = create(EmbedRequestSchema, {
    model: values.model,
    inputs: texts.map((text) => create(EmbedInputSchema, { input: { case: "text", value: text } })),
  });
  const reply = await client.embed(request, callOptions());
  reply.embeddings.forEach((item, index) => {
    const line = { text: texts[index], tokens: item.tokens, embedding: item.values };
    if (item.truncated) line.truncated = true;
    console.log(JSON.stringify(line));
  });
  console.error(
    `${reply.model}: ${reply.embeddings.length} vectors of ${reply.dimensions} ` +
      `(${reply.pooling} pooling), ${reply.promptTokens} tokens, ${reply.totalMs.toFixed(0)} ms`,
  );
}

async function pull(client) {
  const model = values.model || words.join(" ");
  const capability = values.image ? Capability.IMAGE : Capability.TEXT;
  if (values["dry-run"]) return pullDryRun(client, model, capability);
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
  console.error(`pulling ${download.repo} at ${download.commit.slice(0, 12)}: ${plural(count, "file")}`);
  return progressBar(model, Number(download.totalBytes), Number(started.cachedBytes));
}

function progressBar(model, total, done) {
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
  bar.start(total, done, { file: "", rate: "0.0" });
  return bar;
}

// Admit reads the hub's metadata (sizes, a GGUF's header by a ranged read), never the weights.
async function pullDryRun(client, model, capability) {
  const request = create(AdmitRequestSchema, { model, capability });
  const reply = await client.admit(request, callOptions());
  const download = reply.download;
  if (download !== undefined) {
    const count = plural(download.files.length, "file");
    console.log(`${download.repo} at ${download.commit}: would fetch ${count}`);
    const width = Math.max(...download.files.map((file) => file.path.length));
    for (const file of download.files) {
      console.log(`  ${file.path.padEnd(width)}  ${sizeWithBytes(file.sizeBytes)}`);
    }
    console.log(`total ${sizeWithBytes(download.totalBytes)}`);
    const room = `${humanBytes(download.diskFreeBytes)} free on the cache's disk`;
    console.log(download.fitsOnDisk ? `fits on disk (${room})` : `does NOT fit on disk (${room})`);
    if (download.choices.length > 0) {
      const chosen = new Set(download.files.map((file) => file.path));
      const width = Math.max(...download.choices.map((choice) => choice.path.length));
      const how = `choose with ${download.repo}:FILE or :TAG`;
      console.log(`GGUF files in the repo (* the one this pull takes; ${how}):`);
      for (const choice of download.choices) {
        const mark = chosen.has(choice.path) ? "*" : " ";
        console.log(`${mark} ${choice.path.padEnd(width)}  ${humanBytes(choice.sizeBytes)}`);
      }
    }
  } else if (reply.availableLocally) {
    console.log(`${model} is already on the server's disk: a pull would fetch nothing`);
  } else {
    console.log(`${model} is not a hub model a pull would fetch`);
  }
  if (reply.admitted) {
    console.log(`admitted: ${reply.backend}${reply.architecture ? ` (${reply.architecture})` : ""}`);
  } else {
    console.log(`not admitted: ${reply.reason}`);
    process.exitCode = 1;
  }
}

async function cache(client) {
  const [action = "list", ...rest] = words;
  if (action === "list" || action === "ls") return cacheList(client);
  if (action === "delete") return cacheDelete(client, values.model || rest.join(" "));
  console.error(`unknown cache command ${action}; use one of: list (ls), delete MODEL`);
  process.exitCode = 64;
}

async function cacheList(client) {
  const reply = await client.listCached(create(ListCachedRequestSchema), callOptions());
  if (values.json) {
    console.log(JSON.stringify(toJson(ListCachedResponseSchema, reply)));
    return;
  }
  const where = `${reply.cacheDir} (${humanBytes(reply.diskFreeBytes)} free)`;
  if (reply.repos.length === 0) {
    console.log(`no hub models cached in ${where}`);
    return;
  }
  const incomplete = reply.repos.some((repo) => repo.incompleteBytes > 0n);
  const header = ["REPO", "REVISIONS", "FILES", "SIZE"];
  if (incomplete) header.push("INCOMPLETE");
  header.push("LAST USED");
  const rows = reply.repos.map((repo) => {
    const revisions = repo.revisions.map((revision) => {
      const refs = revision.refs.length > 0 ? ` (${revision.refs.join(", ")})` : "";
      return `${revision.commit.slice(0, 12)}${refs}`;
    });
    const paths = repo.revisions.flatMap((revision) => revision.files.map((file) => file.path));
    const files = new Set(paths);
    const partial = repo.incompleteBytes > 0n ? humanBytes(repo.incompleteBytes) : "";
    return [
      repo.repo,
      revisions.join(", ") || "-",
      String(files.size),
      humanBytes(repo.sizeBytes),
      ...(incomplete ? [partial] : []),
      ago(repo.lastUsedUnixMs),
    ];
  });
  printTable([header, ...rows]);
  const total = reply.repos.reduce((sum, repo) => sum + repo.sizeBytes, 0n);
  console.log(`\n${plural(reply.repos.length, "repo")}, ${humanBytes(total)} in ${where}`);
}

async function cacheDelete(client, model) {
  if (!model) {
    console.error("cache delete needs a model: owner/name, owner/name@REVISION, or owner/name[@REVISION]:FILE");
    process.exitCode = 64;
    return;
  }
  const request = create(DeleteCachedRequestSchema, { model });
  const reply = await client.deleteCached(request, callOptions());
  const commits = reply.commits.map((commit) => commit.slice(0, 12)).join(", ");
  const count = plural(reply.commits.length, "revision");
  const revisions = reply.commits.length > 0 ? `${count} (${commits})` : "no revision";
  console.log(`deleted ${model}: ${revisions}, freed ${sizeWithBytes(reply.freedBytes)}`);
}

function printTable(rows) {
  const widths = rows[0].map((_, column) => Math.max(...rows.map((row) => row[column].length)));
  for (const row of rows) {
    console.log(row.map((cell, column) => cell.padEnd(widths[column])).join("  ").trimEnd());
  }
}

function humanBytes(bytes) {
  let value = Number(bytes);
  if (value < 1024) return `${value} B`;
  const units = ["KiB", "MiB", "GiB", "TiB", "PiB"];
  let unit = -1;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(1)} ${units[unit]}`;
}

function sizeWithBytes(bytes) {
  return Number(bytes) < 1024 ? `${bytes} B` : `${humanBytes(bytes)} (${bytes} bytes)`;
}

function ago(unixMs) {
  if (unixMs <= 0n) return "unknown";
  const seconds = Math.max(0, (Date.now() - Number(unixMs)) / 1000);
  if (seconds < 60) return "just now";
  for (const [unit, size] of [["day", 86400], ["hour", 3600], ["minute", 60]]) {
    if (seconds >= size) return `${plural(Math.floor(seconds / size), unit)} ago`;
  }
}

function plural(count, noun) {
  return `${count} ${noun}${count === 1 ? "" : "s"}`;
}

function megabytes(bytesPerSecond) {
  return (bytesPerSecond / 1e6).toFixed(1);
}

const commands = { generate, models, embed, pull, cache };
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
