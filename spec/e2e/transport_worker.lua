-- Worker-thread side of transport_threads_spec: its own Lua state, its own
-- client opened from plain-data options (as the lease renewer does).
local json = require "cozy.json"
local kube = require "cozy.kube"

local M = {}

function M.run(payload, chan)
  local p = json.decode(payload)
  local client = kube.connect(p.opts)
  local cms = client:resource("v1", "configmaps")
  for i = 1, p.n do
    cms:update(p.namespace, p.name, function(obj)
      return { { op = "replace", path = "/data/i", value = tostring(tonumber(obj.data.i) + 1) } }
    end)
    if i % 10 == 0 then chan:ok() end
  end
  client:close()
end

return M
