-- cozy.recipe.permissions: a migration's permissions from a resource named
-- plural or plural.group, known at load time (docs/engine-api.md, "Recipes").
local recipe = require "cozy.recipe"

describe("cozy.recipe.permissions", function()
  it("gives one permission per verb, on the plural and group the name says", function()
    assert.same({
      { verb = "list", group = "apps.cozystack.io", resource = "kuberneteses" },
      { verb = "patch", group = "apps.cozystack.io", resource = "kuberneteses" },
    }, recipe.permissions("kuberneteses.apps.cozystack.io", { "list", "patch" }))
    assert.same({
      { verb = "get", group = "apps", resource = "deployments" }, { verb = "delete", group = "apps", resource = "deployments" },
      { verb = "get", group = "", resource = "secrets" }, { verb = "delete", group = "", resource = "secrets" },
    }, recipe.permissions({ "deployments.apps", "secrets" }, { "get", "delete" }))
    assert.same({ { verb = "get", group = "", resource = "configmaps", namespace = "cozy-system", check_only = true } },
      recipe.permissions("configmaps", { "get" }, { namespace = "cozy-system", check_only = true }))
  end)

  it("refuses a name whose permission discovery would have to decide, and verbs that are not a list of words", function()
    local function refused(expected, ...)
      local ok, err = pcall(recipe.permissions, ...)
      assert.is_false(ok)
      assert.matches(expected, tostring(err), 1, true)
    end
    refused('resource "pvc": not a core plural', "pvc", { "get" })
    refused('resource "deployments.v1.apps": no version', "deployments.v1.apps", { "get" })
    refused('resource "Deployment": name it as plural (core) or plural.group', "Deployment", { "get" })
    refused("verbs must be a list of verbs", "configmaps", {})
    refused("verb 2 must be a lowercase word", "configmaps", { "get", "GET" })
    refused("opts must be a table", "configmaps", { "get" }, "cozy-system")
  end)
end)
