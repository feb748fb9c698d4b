// The calculator task on the npm `openai` package's Responses API and on the Vercel AI SDK's default
// OpenAI provider (also the Responses API), each in its own gateway session. Run from a folder whose
// node_modules holds openai, ai, @ai-sdk/openai and zod: node agents.mjs <gateway url>
import OpenAI from "openai";
import { generateText, stepCountIs, tool } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { z } from "zod";

const [gateway] = process.argv.slice(2);
const SYSTEM = "You are a careful calculator agent.";
const QUESTION = "What is (12 + 30) * 2?";
const run = { add: ({ a, b }) => a + b, multiply: ({ a, b }) => a * b };
const schema = {
  type: "object",
  properties: { a: { type: "integer" }, b: { type: "integer" } },
  required: ["a", "b"],
};

async function npmOpenAI() {
  const client = new OpenAI({ baseURL: `${gateway}/s/npm-openai/v1`, apiKey: "-", maxRetries: 0 });
  const tools = ["add", "multiply"].map((name) => ({ type: "function", name, description: name, parameters: schema }));
  const input = [{ role: "user", content: QUESTION }];
  for (let turn = 0; turn < 6; turn++) {
    const response = await client.responses.create({ model: "policy", instructions: SYSTEM, input, tools });
    input.push(...response.output);
    const calls = response.output.filter((item) => item.type === "function_call");
    if (!calls.length) return response.output_text;
    for (const call of calls) {
      const output = String(run[call.name](JSON.parse(call.arguments)));
      input.push({ type: "function_call_output", call_id: call.call_id, output });
    }
  }
}

async function vercel() {
  const openai = createOpenAI({ baseURL: `${gateway}/s/vercel/v1`, apiKey: "-" });
  const numbers = z.object({ a: z.number().int(), b: z.number().int() });
  const result = await generateText({
    model: openai("policy"),
    system: SYSTEM,
    prompt: QUESTION,
    tools: {
      add: tool({ description: "add", inputSchema: numbers, execute: async (args) => run.add(args) }),
      multiply: tool({ description: "multiply", inputSchema: numbers, execute: async (args) => run.multiply(args) }),
    },
    stopWhen: stepCountIs(6),
    maxRetries: 0,
  });
  return result.text;
}

console.log(JSON.stringify({ "npm-openai": await npmOpenAI(), vercel: await vercel() }));
