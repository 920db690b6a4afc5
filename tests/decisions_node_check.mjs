// OpenAI's Decisions API from Node (run by tests/decisions_clients.rs from the directory
// scripts/setup-test-deps.sh installs the packages into: `node check.mjs URL MODEL`): the AI SDK's
// experimental_decide with @ai-sdk/openai's decisionModel (the strictest client: every answer named,
// distributions within its rounding tolerance, a string choice, no refusal) and openai-node's
// decisions.create.
import { createOpenAI } from '@ai-sdk/openai';
import { experimental_decide as decide } from 'ai';
import OpenAI from 'openai';

const [url, name] = process.argv.slice(2);
const provider = createOpenAI({ baseURL: url + '/v1', apiKey: 'sk-local' });
const r = await decide({
  model: provider.decisionModel(name),
  state: 'The support agent issued a full refund after the parcel arrived crushed.',
  questions: {
    refunded: { type: 'boolean', instructions: 'Was a refund issued?', criteria: { true: 'money returned' } },
    team: { type: 'choice', instructions: 'Which team?', criteria: { billing: 'Payments', shipping: null } },
    urgency: { type: 'score', instructions: 'How urgent?', criteria: ['low', 'medium', 'high'] },
  },
  providerOptions: { openai: { promptCacheKey: 'k1' } },
  maxRetries: 0,
});
const a = r.answers;
if (typeof a.refunded?.probability !== 'number' && typeof a.refunded?.value !== 'boolean')
  throw new Error('refunded: ' + JSON.stringify(a.refunded));
if (!['billing', 'shipping'].includes(a.team?.choice ?? a.team?.value))
  throw new Error('team: ' + JSON.stringify(a.team));
console.log('ai experimental_decide:', JSON.stringify(a), JSON.stringify(r.usage));

const client = new OpenAI({ baseURL: url + '/v1', apiKey: 'sk-local', maxRetries: 0 });
const questions = [
  { type: 'predicate', name: 'damaged', instructions: 'Is an item damaged?' },
  { type: 'choice', name: 'dept', instructions: 'Which department?', choices: [{ value: 'returns' }, { value: 'billing' }] },
  { type: 'score', instructions: 'How severe?', levels: [{ label: 'cosmetic' }, { label: 'broken' }] },
];
const { data: d, response } = await client.decisions
  .create({ model: name, input: 'The screen arrived broken.', questions })
  .withResponse();
if (JSON.stringify(d.answers.map((x) => [x.type, x.name])) !== '[["predicate","damaged"],["choice","dept"],["score",null]]')
  throw new Error('answers: ' + JSON.stringify(d.answers));
for (const k of ['input_tokens', 'output_tokens', 'total_tokens'])
  if (!Number.isInteger(d.usage[k])) throw new Error('usage: ' + JSON.stringify(d.usage));
if (!response.headers.get('x-request-id')) throw new Error('no x-request-id');
console.log('openai-node decisions.create:', JSON.stringify(d.answers.map((x) => x.type)), d.usage.input_tokens);
try {
  await client.decisions.create({ model: name, input: 'x', questions: [] });
  throw new Error('an empty question list was accepted');
} catch (e) {
  if (!(e instanceof OpenAI.BadRequestError) || e.param !== 'questions') throw e;
  console.log('openai-node BadRequestError.param:', e.param);
}
console.log('all node decisions checks passed');
