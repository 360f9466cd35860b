-- What a saved plan binds of a step's reads (cozy.kube.binding;
-- docs/operations.md, "A saved plan"): an object, its status, and another
-- subresource that answers with its object's resourceVersion (a
-- Deployment's scale, which a script reads with `kubectl get --raw`), so that
-- `run --plan` refuses to start once it changed; a subresource that answers
-- none (a pod's log) cannot be bound and is not recorded.
local binding = require "cozy.kube.binding"

local STAMP = "/api/v1/namespaces/cozy-system/configmaps/cozystack-version"
local SCALE = "/apis/apps/v1/namespaces/cozy-system/deployments/web/scale"
local LOG = "/api/v1/namespaces/cozy-system/pods/worker/log"

local function recorded(reads)
  local b = binding.new("record", STAMP)
  b:begin_step(1)
  for _, r in ipairs(reads) do b:read(r[1], "", r[2], r[3]) end
  b:end_step()
  local out = {}
  for _, r in ipairs((b:recorded())) do out[r.path] = r.absent and "absent" or r.resourceVersion end
  return out
end

-- a client whose GET of each path answers `now[path]` (a resourceVersion), else 404
local function client_of(now)
  return { call = function(_, method, path)
    assert.equal("GET", method)
    if now[path] == nil then error({ code = 404, message = "not found" }, 0) end
    return { metadata = { resourceVersion = now[path] } }
  end }
end

describe("a saved plan's reads", function()
  it("binds a subresource read by its object's resourceVersion: a changed scale refuses the run", function()
    local reads = recorded {
      { SCALE, true, { kind = "Scale", metadata = { name = "web", namespace = "cozy-system", resourceVersion = "7" },
        spec = { replicas = 2 } } },
    }
    assert.same({ [SCALE] = "7" }, reads)
    local plan = { { path = SCALE, resourceVersion = "7" } }
    assert.is_nil(binding.changed(client_of { [SCALE] = "7" }, plan, {}))
    assert.equal(SCALE .. " changed since the plan read it: resourceVersion 8, planned 7",
      binding.changed(client_of { [SCALE] = "8" }, plan, {}))
  end)

  it("records neither a subresource that answers no resourceVersion nor a subresource's 404", function()
    assert.same({}, recorded {
      { LOG, true, "a line of the pod's log\n" },
      { SCALE, false, { code = 404, message = "the server could not find the requested resource" } },
    })
  end)

  it("keeps the first answer of an object read twice, an absent one included", function()
    local path = "/api/v1/namespaces/cozy-system/configmaps/late"
    assert.same({ [path] = "absent" }, recorded {
      { path, false, { code = 404, message = "not found" } },
      { path, true, { metadata = { name = "late", resourceVersion = "9" } } },
    })
  end)
end)
