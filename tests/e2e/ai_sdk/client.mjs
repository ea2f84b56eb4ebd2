// The Vercel AI SDK's default OpenAI provider, `openai(model)` (the Responses API),
// pointed at ebb; `chat` uses its Chat Completions model instead (`openai.chat(model)`).
// Usage: node client.mjs text|stream|tool|chat|object
// Reads EBB_BASE_URL (…/v1), EBB_API_KEY, EBB_MODEL and EBB_PROMPT; prints one JSON object.
import { createOpenAI } from "@ai-sdk/openai";
import { generateObject, generateText, jsonSchema, stepCountIs, streamText, tool } from "ai";

const openai = createOpenAI({
  baseURL: process.env.EBB_BASE_URL,
  apiKey: process.env.EBB_API_KEY,
});
const model = openai(process.env.EBB_MODEL);
const prompt = process.env.EBB_PROMPT ?? "What is the capital of France?";
const weatherPrompt = "What is the weather in Paris?";
const calls = [];
const city = jsonSchema({
  type: "object",
  properties: { city: { type: "string" } },
  required: ["city"],
  additionalProperties: false,
});
const getWeather = tool({
  description: "Current weather of a city",
  inputSchema: city,
  execute: async ({ city }) => {
    calls.push(city);
    return "Sunny, 21 degrees celsius.";
  },
});

async function run(kind) {
  const common = { model, prompt, temperature: 0, maxOutputTokens: 100, maxRetries: 0 };
  if (kind === "text") {
    const r = await generateText(common);
    return { text: r.text, finishReason: r.finishReason, usage: r.usage };
  }
  if (kind === "chat") {
    const r = await generateText({ ...common, model: openai.chat(process.env.EBB_MODEL) });
    return { text: r.text, finishReason: r.finishReason, usage: r.usage };
  }
  if (kind === "object") {
    // Structured output: the Responses API's text.format json_schema.
    const r = await generateObject({ ...common, schema: city });
    return { object: r.object, finishReason: r.finishReason };
  }
  if (kind === "stream") {
    const r = streamText(common);
    const parts = [];
    for await (const part of r.textStream) parts.push(part);
    return { text: await r.text, parts: parts.length, finishReason: await r.finishReason };
  }
  if (kind === "tool") {
    // The first step must call the tool (named: "required" lets a small model call it
    // again and again until the token limit); the second answers with its result.
    const r = await generateText({
      ...common,
      prompt: weatherPrompt,
      tools: { get_weather: getWeather },
      prepareStep: ({ stepNumber }) => ({
        toolChoice: stepNumber === 0 ? { type: "tool", toolName: "get_weather" } : "none",
      }),
      stopWhen: stepCountIs(2),
    });
    return { text: r.text, calls, steps: r.steps.length, finishReason: r.finishReason };
  }
  throw new Error(`unknown kind ${kind}`);
}

try {
  console.log(JSON.stringify(await run(process.argv[2])));
} catch (error) {
  console.log(JSON.stringify({ error: String(error), name: error?.name }));
  process.exit(1);
}
