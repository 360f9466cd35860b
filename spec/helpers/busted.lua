-- busted's `helper` (.busted): loaded once before the spec files, it
-- registers the harness's assertions with luassert (spec/README.md).
-- `require "spec.helpers"` needs ./?/init.lua, which a command-line --lpath
-- (replacing .busted's) may leave out.
if not package.path:find("./?/init.lua", 1, true) then
  package.path = "./?/init.lua;" .. package.path
end
require("spec.helpers.assertions").register(require "luassert")
