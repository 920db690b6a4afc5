// The Vercel AI SDK (ai + @ai-sdk/openai, whose default model API is /v1/responses) against a running
// serve: generateText, streamText, a tool, generateObject, embed and embedMany. Run by tests/vercel_ai_sdk.rs from the
// directory scripts/setup-test-deps.sh installs the packages into: `node check.mjs URL MODEL`.
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, streamText, generateObject, tool, stepCountIs, embed, embedMany, cosineSimilarity } from 'ai';
import { z } from 'zod';

const [url, name] = process.argv.slice(2);
const openai = createOpenAI({ baseURL: url + '/v1', apiKey: 'unused' });
const model = openai(name);

const t = await generateText({ model, prompt: 'Say hello in one word.', maxOutputTokens: 24, temperature: 0 });
if (typeof t.text !== 'string') throw new Error('generateText: ' + JSON.stringify(t));
console.log('generateText:', JSON.stringify(t.text), t.finishReason, t.usage.inputTokens);

const s = streamText({ model, prompt: 'Say hello in one word.', maxOutputTokens: 24, temperature: 0 });
let streamed = '';
for await (const d of s.textStream) streamed += d;
if (streamed !== t.text) throw new Error(`streamText ${JSON.stringify(streamed)} != ${JSON.stringify(t.text)}`);
console.log('streamText:', JSON.stringify(streamed));

let called = [];
const w = await generateText({
  model, prompt: 'What is the weather in Paris?', maxOutputTokens: 80, temperature: 0, toolChoice: 'required',
  tools: { get_weather: tool({ description: 'Weather in a city', inputSchema: z.object({ city: z.string() }),
    execute: async ({ city }) => { called.push(city); return `sunny in ${city}`; } }) },
  stopWhen: stepCountIs(1),
});
if (called.length === 0) throw new Error('tool not run: ' + JSON.stringify(w.steps?.map(s => s.content)));
console.log('tool:', called, w.finishReason);

const o = await generateObject({
  model, prompt: 'Which team handles a failed payout?', maxOutputTokens: 60, temperature: 0,
  schema: z.object({ team: z.enum(['billing', 'tech']) }),
});
if (!['billing', 'tech'].includes(o.object.team)) throw new Error('generateObject: ' + JSON.stringify(o.object));
console.log('generateObject:', o.object);

const em = openai.embedding(name);
const one = await embed({ model: em, value: 'The order shipped late.' });
const many = await embedMany({ model: em, values: ['The order shipped late.', 'Refund the customer.'] });
if (many.embeddings.length !== 2 || one.embedding.length !== many.embeddings[0].length)
  throw new Error('embedMany: ' + JSON.stringify(many.usage));
const same = cosineSimilarity(one.embedding, many.embeddings[0]);
if (!(same > 0.99999)) throw new Error('embed vs embedMany of the same text: cosine ' + same);
console.log('embed / embedMany:', one.embedding.length, 'dimensions, usage', JSON.stringify(many.usage));
