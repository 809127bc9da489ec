-- Node heartbeats (not a decision: no prelude).
-- KEYS[1]  a sorted set: member = a node's id, score = when its heartbeat stops counting, in ms
--          since the epoch (the server's TIME, so every node is judged by one clock), by the
--          node's own expiry: nodes with different heartbeat intervals never prune each other
-- ARGV[1]  this node's id            ARGV[2]  expiry in ms: this node, silent this long, is gone
-- ARGV[3]  '1' to beat, '0' to leave
-- reply    the number of live nodes (this one included when beating)
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local expiry = tonumber(ARGV[2])
if ARGV[3] == '1' then
  redis.call('ZADD', KEYS[1], string.format('%d', now + expiry), ARGV[1])
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('(%d', now))
-- The set lives as long as its last heartbeat counts: no node left, no key left.
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] then redis.call('PEXPIREAT', KEYS[1], last[2]) end
return redis.call('ZCARD', KEYS[1])
