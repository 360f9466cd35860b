-- busted's `helper` (.busted): loaded once before the spec files, it
-- registers the harness's assertions with luassert (spec/README.md).
require("spec.helpers.assertions").register(require "luassert")
