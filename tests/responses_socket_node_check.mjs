// openai-node's Responses WebSocket mode (`ResponsesWS` from openai/resources/responses/ws over the
// `ws` package; run by tests/responses_socket_sdk.rs: `node check.mjs URL MODEL`): a turn streamed,
// a `store: false` continuation by `previous_response_id` on the same socket, and the
// `previous_response_not_found` error event after which the socket still answers.
import OpenAI from 'openai';
import { ResponsesWS } from 'openai/resources/responses/ws';

const [url, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: url + '/v1', apiKey: 'sk-local', maxRetries: 0 });
const ws = new ResponsesWS(client);
const events = ws.stream();

async function turn(body) {
  ws.send({ type: 'response.create', model, max_output_tokens: 8, temperature: 0, ...body });
  const kinds = [];
  for (;;) {
    const { value, done } = await events.next();
    if (done) throw new Error('the socket closed mid-turn: ' + kinds.join(','));
    // the server's `error` event arrives as the SDK's error, the event itself in `.error`
    if (value.type === 'error' && value.error?.error?.type === 'error') return [['error'], value.error.error];
    if (value.type !== 'message') continue;
    const e = value.message;
    kinds.push(e.type);
    if (['response.completed', 'response.incomplete', 'response.failed'].includes(e.type)) return [kinds, e.response];
    if (e.type === 'error') return [kinds, e];
  }
}

const [k1, first] = await turn({ input: 'Say hello.', store: false });
if (k1[0] !== 'response.created' || !['response.completed', 'response.incomplete'].includes(k1.at(-1)))
  throw new Error('first turn: ' + k1.join(','));
console.log('node first turn:', k1.length, 'events');
const [k2, second] = await turn({ input: 'Again.', store: false, previous_response_id: first.id });
if (second.previous_response_id !== first.id) throw new Error('continuation: ' + JSON.stringify(second));
console.log('node continued:', second.id);
const [k3, err] = await turn({ input: 'x', previous_response_id: 'resp_unknown' });
if (k3.join() !== 'error' || err.error?.code !== 'previous_response_not_found')
  throw new Error('error event: ' + JSON.stringify(err));
const [k4] = await turn({ input: 'Still there?' });
if (!['response.completed', 'response.incomplete'].includes(k4.at(-1))) throw new Error('after the error: ' + k4);
ws.close({ code: 1000, reason: 'done' });
console.log('node ok');
