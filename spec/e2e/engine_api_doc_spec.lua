-- docs/engine-api.md's examples run as printed: each ```lua block under the
-- sections below, in a migration's sandbox (sandbox.env), so that what the
-- guide shows is both true and reachable from a migration. An example whose
-- assert no longer holds fails here.
local files = require "spec.helpers.files"
local sandbox = require "cozy.sandbox"

local DOC = "docs/engine-api.md"

-- The first ```lua block after the heading line `heading`.
local function example(text, heading)
  local at = assert(text:find("\n" .. heading .. "\n", 1, true), "no section " .. heading)
  return assert(text:match("```lua\n(.-)```", at), "no lua example under " .. heading)
end

describe("docs/engine-api.md's examples", function()
  local doc = assert(files.read(DOC))

  for _, heading in ipairs { "### Labels and annotations", "### Matching names" } do
    it(heading:sub(5) .. " runs in a migration's sandbox as printed", function()
      local code = example(doc, heading)
      local chunk = assert(load(code, "=" .. heading, "t", sandbox.env()))
      chunk()
    end)
  end
end)
