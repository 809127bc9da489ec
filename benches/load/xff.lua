-- wrk script of the load test (scripts/load.sh): every request comes from one of 10,000
-- client IPs, named in X-Forwarded-For, as a reverse proxy on 127.0.0.1 would send them.
-- Each wrk thread draws the clients in its own pseudo-random order.
local clients = {}
for i = 0, 9999 do
  clients[i + 1] = string.format("10.%d.%d.%d", math.floor(i / 65536) % 256,
    math.floor(i / 256) % 256, i % 256)
end

local headers = {}

request = function()
  headers["X-Forwarded-For"] = clients[math.random(1, 10000)]
  return wrk.format("GET", "/api/hello", headers)
end
