-- wrk script: POST passkey-confirm, each request to the next demo account, so every request is
-- a first confirm (one provider call). Use one thread (-t1): the account counter is per thread.
--   wrk -t1 -c20 -d10s --latency -s bench/confirm.lua http://127.0.0.1:8080 -- FIRST [KEY]
-- Start the stack with enough accounts: python -m devstack stack --demo-accounts N.
-- wrk prints "Non-2xx or 3xx responses" when any answer was not 200.
local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  first = tonumber(args[1] or "1")
  key = args[2] or "dev-key-ws-demo"
  sent = 0
end

function request()
  local path = "/v1/accounts/acc_demo_" .. (first + sent) .. "/auth/passkey-confirm"
  sent = sent + 1
  return wrk.format("POST", path, { ["X-Api-Key"] = key }, "")
end

function done(summary, latency, requests)
  for _, thread in ipairs(threads) do
    local first, sent = thread:get("first"), thread:get("sent")
    io.write(string.format("accounts: acc_demo_%d .. acc_demo_%d\n", first, first + sent - 1))
  end
end
