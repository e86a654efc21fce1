#!/usr/bin/env node
// A task container in Node.js (standard library only: no npm install): Banking77 intent
// classification served over the same HTTP task contract as the Python kit, to show the
// contract is language-agnostic. The harness starts it as
//   node benchmarks/containers/node/server.js --host 127.0.0.1 --port N --data-dir D
// and drives it exactly like a Python container. It reads <D>/banking77/{train,test}.csv and
// categories.json, or downloads them once into the harness's dataset cache (sha256-checked),
// and calls the policy model itself through the OpenAI-compatible API with `fetch`.
"use strict";

const crypto = require("node:crypto");
const fs = require("node:fs");
const http = require("node:http");
const os = require("node:os");
const path = require("node:path");

const CONTRACT_VERSION = "gepa_task.v1";
const GEPA_OPTIMIZER_CONTRACT = "synth_optimizers.gepa.v2";
const PROGRAM_VERSION = "prompt_program.v1";
const TASKSET_ID = "node_banking77";
const BASE = "https://raw.githubusercontent.com/PolyAI-LDN/task-specific-datasets/master/banking_data";
// Same pins as the Python banking77 container (upstream commit 57ec275d).
const FILES = {
  "train.csv": "b06e26ac675513959a63135f11b94ea7786ed02da65db93a5650d8838cbc664b",
  "test.csv": "d12d6e3bc4c3103966ae786dc435913c0c563dfa328f5a3646d0e62cfeeb474d",
  "categories.json": "53261da888122daf2d120d925458631d9619e15d82e56052e7a42e535ce32b63",
};
const SHUFFLE_SEED = 77;
const SECRET_FIELDS = new Set(["api_key", "apikey", "key", "token", "access_token", "authorization", "secret", "bearer"]);
const SEED_SYSTEM =
  "You classify banking customer-support messages. Reply with the single intent label from the " +
  "list that best matches the message, and nothing else.";
// The message comes before the comma-separated label list (one line), so a model or a rule
// can read the message without the label names.
const USER_TEMPLATE = "Customer message:\n{text}\n\nAvailable intents: {labels}\n\nAnswer with the intent label only.";

// ---------------------------------------------------------------- options

function parseArgs(argv) {
  // $PORT/$HOST (as many hosted containers read them) unless --port/--host say otherwise
  const opts = { host: process.env.HOST || "127.0.0.1", port: process.env.PORT || null,
                 dataDir: process.env.HARNESS_DATA_DIR || null,
                 apiKeyEnv: null, policyKeyEnv: null };
  const names = { "--host": "host", "--port": "port", "--data-dir": "dataDir",
                  "--api-key-env": "apiKeyEnv", "--policy-key-env": "policyKeyEnv" };
  for (let i = 0; i < argv.length; i++) {
    const [flag, inline] = argv[i].split(/=(.*)/s);
    if (!(flag in names)) throw new Error(`unknown option ${flag}`);
    const value = inline !== undefined ? inline : argv[++i];
    if (value === undefined) throw new Error(`option ${flag} needs a value`);
    opts[names[flag]] = value;
  }
  opts.port = Number(opts.port);
  if (!Number.isInteger(opts.port) || opts.port <= 0) throw new Error("--port N is required");
  return opts;
}

// ---------------------------------------------------------------- data

function sha256(buffer) {
  return crypto.createHash("sha256").update(buffer).digest("hex");
}

async function datasetFile(dataDir, filename) {
  if (dataDir) {
    const local = path.join(dataDir, "banking77", filename);
    if (fs.existsSync(local)) return fs.readFileSync(local); // a local copy is trusted as is
  }
  const cacheBase = process.env.XDG_CACHE_HOME || path.join(os.homedir(), ".cache");
  const target = path.join(cacheBase, "gepa-harness", "datasets", "banking77", filename);
  if (fs.existsSync(target) && sha256(fs.readFileSync(target)) === FILES[filename]) return fs.readFileSync(target);
  const response = await fetch(`${BASE}/${filename}`, { signal: AbortSignal.timeout(60000) });
  if (!response.ok) throw new Error(`cannot download banking77/${filename}: HTTP ${response.status}`);
  const body = Buffer.from(await response.arrayBuffer());
  if (sha256(body) !== FILES[filename]) throw new Error(`checksum mismatch for banking77/${filename}; refusing it`);
  fs.mkdirSync(path.dirname(target), { recursive: true });
  const tmp = `${target}.${process.pid}.part`; // same folder, so the rename is atomic
  fs.writeFileSync(tmp, body);
  fs.renameSync(tmp, target);
  return body;
}

function parseCsv(text) {
  // RFC 4180: quoted fields may hold commas, newlines and doubled quotes.
  const rows = [];
  let row = [], field = "", quoted = false;
  for (let i = 0; i < text.length; i++) {
    const ch = text[i];
    if (quoted) {
      if (ch === '"' && text[i + 1] === '"') { field += '"'; i++; }
      else if (ch === '"') quoted = false;
      else field += ch;
    } else if (ch === '"') quoted = true;
    else if (ch === ",") { row.push(field); field = ""; }
    else if (ch === "\n" || ch === "\r") {
      if (ch === "\r" && text[i + 1] === "\n") i++;
      row.push(field); rows.push(row); row = []; field = "";
    } else field += ch;
  }
  if (field !== "" || row.length) { row.push(field); rows.push(row); }
  return rows.filter((r) => r.length > 1 || r[0] !== "");
}

function mulberry32(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

async function loadTaskset(dataDir) {
  const labels = JSON.parse((await datasetFile(dataDir, "categories.json")).toString("utf8"));
  const known = new Set(labels);
  const splits = {};
  for (const split of ["train", "test"]) {
    const [header, ...records] = parseCsv((await datasetFile(dataDir, `${split}.csv`)).toString("utf8"));
    if (header.join(",") !== "text,category") throw new Error(`banking77/${split}.csv: unexpected header`);
    const rows = records.map(([text, label], i) => ({ text, label, source_row: i }));
    const unknown = rows.filter((r) => !known.has(r.label));
    if (unknown.length) throw new Error(`banking77/${split}.csv has labels not in categories.json`);
    // The CSVs are sorted by label; a seeded shuffle makes any prefix span many intents.
    const random = mulberry32(SHUFFLE_SEED);
    for (let i = rows.length - 1; i > 0; i--) {
      const j = Math.floor(random() * (i + 1));
      [rows[i], rows[j]] = [rows[j], rows[i]];
    }
    splits[split] = rows;
  }
  return { labels, splits };
}

// ---------------------------------------------------------------- task

function normalizeLabel(text) {
  let line = (text.split(/\r?\n/).find((l) => l.trim()) || "").trim();
  line = line.replace(/^[\s"'`*]+|[\s"'`*]+$/g, "").toLowerCase();
  for (const prefix of ["label:", "intent:"]) if (line.startsWith(prefix)) line = line.slice(prefix.length);
  line = line.replace(/^[\s"'`*]+|[\s"'`*]+$/g, "").replace(/\.+$/, "").replace(/^[\s"'`*]+|[\s"'`*]+$/g, "");
  return line.split(/\s+/).filter(Boolean).join("_").replace(/\?+$/, "");
}

function program() {
  return {
    version: PROGRAM_VERSION,
    program_id: "node_banking77.intent.v1",
    modules: [
      { module_id: "system", role: "system", content: SEED_SYSTEM, mutable: true, candidate_field: "system" },
      { module_id: "user", role: "user", content: USER_TEMPLATE, mutable: false },
    ],
    target_modules: ["system"],
    seed_candidate: { system: SEED_SYSTEM },
  };
}

function render(candidate, row, labels) {
  const user = USER_TEMPLATE.replace("{text}", row.text).replace("{labels}", labels.join(", "));
  return [{ role: "system", content: candidate.system }, { role: "user", content: user }];
}

function score(row, output, labels) {
  const given = normalizeLabel(output);
  const expected = row.label;
  if (given === normalizeLabel(expected)) return [1.0, `Correct: \`${expected}\`.`];
  if (!given) return [0.0, `Wrong: expected intent \`${expected}\`, the answer was empty.`];
  let feedback = `Wrong: expected intent \`${expected}\`, the answer was \`${given}\`.`;
  if (!labels.some((l) => normalizeLabel(l) === given)) {
    feedback += ` \`${given}\` is not one of the 77 intent labels; answer with a label from the list exactly.`;
  }
  return [0.0, feedback];
}

// ---------------------------------------------------------------- policy model

function classify(status) {
  if (status === 429) return "rate_limited";
  return status >= 500 || status === 408 ? "transient" : "fatal";
}

async function callPolicy(policy, messages, seed, keyEnv) {
  const base = (policy.inference_url || policy.base_url).replace(/\/+$/, "").replace(/\/chat\/completions$/, "");
  const body = { model: policy.model, messages, temperature: policy.temperature ?? 0.0,
                 max_tokens: policy.max_tokens ?? 256 };
  if (Number.isInteger(seed)) body.seed = seed;
  const headers = { "content-type": "application/json" };
  if (keyEnv) {
    if (!process.env[keyEnv]) throw Object.assign(new Error(`environment variable ${keyEnv} is not set`), { kind: "fatal" });
    headers.authorization = `Bearer ${process.env[keyEnv]}`;
  }
  let lastError = "no attempt made", kind = "transient";
  for (let attempt = 0; attempt < 4; attempt++) {
    const started = Date.now();
    let wait = null;
    try {
      const response = await fetch(`${base}/chat/completions`, {
        method: "POST", headers, body: JSON.stringify(body), signal: AbortSignal.timeout(120000) });
      const text = await response.text();
      if (response.ok) {
        const payload = JSON.parse(text);
        const choice = payload.choices[0];
        const usage = payload.usage || {};
        return { text: choice.message.content || "", finishReason: choice.finish_reason ?? null,
                 promptTokens: usage.prompt_tokens || 0, completionTokens: usage.completion_tokens || 0,
                 latency: (Date.now() - started) / 1000 };
      }
      kind = classify(response.status);
      lastError = `HTTP ${response.status} from ${base}/chat/completions: ${text.slice(0, 200)}`;
      if (kind === "fatal") break;
      const retryAfter = Number(response.headers.get("retry-after"));
      if (Number.isFinite(retryAfter) && retryAfter >= 0) wait = retryAfter * 1000;
    } catch (err) {
      kind = "transient";
      lastError = `${err.name} calling ${base}/chat/completions`;
    }
    if (attempt < 3) await new Promise((r) => setTimeout(r, wait ?? Math.min(20000, 500 * 2 ** attempt) * (0.5 + Math.random())));
  }
  throw Object.assign(new Error(`model call failed (${kind}): ${lastError}`), { kind });
}

// ---------------------------------------------------------------- HTTP

class HttpError extends Error {
  constructor(status, detail) { super(typeof detail === "string" ? detail : "error"); this.status = status; this.detail = detail; }
}

function send(res, status, body, headers = {}) {
  const text = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text), ...headers });
  res.end(text);
}

async function readJson(req) {
  const chunks = [];
  let size = 0;
  for await (const chunk of req) {
    size += chunk.length;
    if (size > 16 * 1024 * 1024) throw new HttpError(413, "request body too large");
    chunks.push(chunk);
  }
  try {
    return JSON.parse(Buffer.concat(chunks).toString("utf8"));
  } catch {
    throw new HttpError(422, [{ loc: ["body"], msg: "body is not valid JSON", type: "json_invalid" }]);
  }
}

function lookup(taskset, taskId) {
  const match = /^(.*):(\d+)$/.exec(String(taskId));
  const rows = match && taskset.splits[match[1]];
  if (!rows || Number(match[2]) >= rows.length) throw new HttpError(404, `unknown task id ${JSON.stringify(taskId)}`);
  return { split: match[1], index: Number(match[2]), row: rows[Number(match[2])] };
}

function checkRollout(body) {
  const problems = [];
  for (const field of ["rollout_id", "task_id"]) if (typeof body[field] !== "string") problems.push(field);
  if (!body.candidate || typeof body.candidate !== "object") problems.push("candidate");
  const policy = body.policy;
  if (!policy || typeof policy !== "object" || typeof policy.model !== "string") problems.push("policy");
  if (problems.length) throw new HttpError(422, problems.map((f) => ({ loc: ["body", f], msg: "Field required", type: "missing" })));
  const leaked = Object.keys(policy).filter((k) => SECRET_FIELDS.has(k.toLowerCase()));
  // Name the field, never echo its value.
  if (leaked.length) throw new HttpError(422, [{ loc: ["body", "policy"], msg: `policy block must not carry credentials: ${leaked.sort()}`, type: "value_error" }]);
  if (!policy.base_url && !policy.inference_url) throw new HttpError(422, [{ loc: ["body", "policy"], msg: "policy block needs base_url or inference_url", type: "value_error" }]);
  if (typeof body.candidate.system !== "string") throw new HttpError(422, "candidate lacks field(s) ['system']");
}

async function rollout(body, taskset, opts) {
  checkRollout(body);
  const given = body.task || {};
  const row = typeof given.text === "string" && typeof given.label === "string" ? given : lookup(taskset, body.task_id).row;
  const messages = render(body.candidate, row, taskset.labels);
  const trace = { messages, output: "", model: body.policy.model };
  const seed = body.metadata && Number.isInteger(body.metadata.seed) ? body.metadata.seed : null;
  let result;
  try {
    result = await callPolicy(body.policy, messages, seed, opts.policyKeyEnv);
  } catch (err) {
    // An error row without a reward, carrying the cause: the harness counts the failure and
    // leaves it out of every score (a missing reward is never a zero).
    return { rollout_id: body.rollout_id, status: "error", error: err.message, error_kind: err.kind || "fatal",
             usage: { prompt_tokens: 0, completion_tokens: 0, cost_usd: null }, trace };
  }
  const [reward, feedback] = score(row, result.text, taskset.labels);
  Object.assign(trace, { output: result.text, finish_reason: result.finishReason, latency_s: result.latency });
  // `inputs`: what the policy saw (the non-system messages), shown to the proposer
  const inputs = messages.filter((m) => m.role !== "system").map((m) => m.content).join("\n\n");
  return { rollout_id: body.rollout_id, status: "ok", reward_info: { outcome_reward: reward },
           usage: { prompt_tokens: result.promptTokens, completion_tokens: result.completionTokens, cost_usd: null },
           trace, actionable_side_info: { feedback, inputs } };
}

function authorized(req, expectedKey) {
  if (!expectedKey) return true;
  const [scheme, token] = (req.headers.authorization || "").split(" ");
  const given = Buffer.from((token || "").trim());
  const wanted = Buffer.from(expectedKey);
  return scheme && scheme.toLowerCase() === "bearer" && given.length === wanted.length && crypto.timingSafeEqual(given, wanted);
}

function makeHandler(taskset, opts) {
  const expectedKey = opts.apiKeyEnv ? process.env[opts.apiKeyEnv] || null : null;
  const metadata = {
    runtime_id: TASKSET_ID, name: "Banking77 intent classification (Node.js container)",
    capabilities: { protocol: "http", contract_version: CONTRACT_VERSION },
    metadata: { optimizer_contracts: { gepa: { version: GEPA_OPTIMIZER_CONTRACT } }, taskset_id: TASKSET_ID,
                program_id: program().program_id, language: "javascript", runtime: `node ${process.version}` },
  };
  const routes = {
    "GET /health": () => ({ status: "ok", contract_version: CONTRACT_VERSION }),
    "GET /metadata": () => metadata,
    "GET /program": () => program(),
    "GET /taskset": () => ({ taskset_id: TASKSET_ID,
                             splits: Object.fromEntries(Object.entries(taskset.splits).map(([k, v]) => [k, v.length])),
                             labels: taskset.labels,
                             source: "https://github.com/PolyAI-LDN/task-specific-datasets (banking_data, CC BY 4.0)" }),
    "GET /task_info": () => ({ description: "Classify a banking customer-support message into exactly one of 77 intent labels.",
                               labels: taskset.labels }),
    "POST /taskset/tasks": async (req) => {
      const body = await readJson(req);
      if (!(body.split in taskset.splits)) throw new HttpError(404, `unknown split ${JSON.stringify(body.split)}; splits are ${Object.keys(taskset.splits).sort()}`);
      if (!Array.isArray(body.task_ids)) throw new HttpError(422, [{ loc: ["body", "task_ids"], msg: "Field required", type: "missing" }]);
      const tasks = body.task_ids.map((taskId) => {
        const { split, index, row } = lookup(taskset, taskId);
        if (split !== body.split) throw new HttpError(404, `task id ${JSON.stringify(taskId)} is not in split ${JSON.stringify(body.split)}`);
        return { task_id: taskId, split, seed: index, ...row };
      });
      return { tasks };
    },
    "POST /rollout": async (req) => rollout(await readJson(req), taskset, opts),
  };
  return async (req, res) => {
    const route = `${req.method} ${new URL(req.url, "http://x").pathname}`;
    try {
      if (route !== "GET /health" && !authorized(req, expectedKey)) {
        return send(res, 401, { detail: "missing or wrong bearer key" }, { "www-authenticate": "Bearer" });
      }
      const handler = routes[route];
      if (!handler) throw new HttpError(404, "Not Found");
      send(res, 200, await handler(req));
    } catch (err) {
      if (err instanceof HttpError) return send(res, err.status, { detail: err.detail });
      console.error(err);
      send(res, 500, { detail: "internal error" });
    }
  };
}

async function main() {
  let opts;
  try {
    opts = parseArgs(process.argv.slice(2));
  } catch (err) {
    console.error(`usage: node server.js --port N [--host H] [--data-dir D] [--api-key-env V] [--policy-key-env V]\nerror: ${err.message}`);
    process.exit(2);
  }
  if (opts.apiKeyEnv && !process.env[opts.apiKeyEnv]) console.warn(`${opts.apiKeyEnv} is not set: the container accepts requests without a key`);
  let taskset;
  try {
    taskset = await loadTaskset(opts.dataDir); // load before listening: healthy means ready
  } catch (err) {
    console.error(`error: ${err.message}`);
    process.exit(2);
  }
  const server = http.createServer(makeHandler(taskset, opts));
  server.keepAliveTimeout = 65000;
  server.listen(opts.port, opts.host);
  for (const signal of ["SIGTERM", "SIGINT"]) {
    process.on(signal, () => { server.close(() => process.exit(0)); server.closeAllConnections(); });
  }
}

if (require.main === module) main();

module.exports = { parseCsv, normalizeLabel, score, mulberry32 };
