-- What an API request is, as the API server's authorizer sees it: the
-- RequestInfo of a method and a path (verb, API group, resource,
-- subresource, namespace, name), and whether a list of declared
-- permissions covers it.
--
-- The choke point (Client:call) decides from these alone, never from the
-- name of the Lua method that issued the request: any method but GET and
-- HEAD is a write.
local request = {}

local reads = { GET = true, HEAD = true }

function request.is_write(method)
  return not reads[method]
end

local verbs = { POST = "create", PUT = "update", PATCH = "patch" }

-- A secrets path: core v1's secrets collection, an object in it, or its
-- subresources. What is sent there or answered from there may hold a
-- Secret's data, so the trace and the error messages leave it out.
function request.is_secrets(path)
  return path:match("^/api/v1/secrets") ~= nil
    or path:match("^/api/v1/namespaces/[^/]+/secrets") ~= nil
end

-- The path's segments as the API server routes them: percent-decoded
-- first, then split on "/" (Go's net/http decodes URL.Path before the
-- RequestInfo is read, so "%2F" is a separator there, not part of a name).
-- Returns nil and why for a path the gate cannot judge the way the server
-- would: a malformed escape, a byte that has no place in a path, or an
-- empty, "." or ".." segment (which redirects, 404s or routes elsewhere).
local function split(path)
  local decoded = path
  -- (most paths have no escape: three patterns and a substitution for
  -- nothing, on every request, were a few percent of a plan's Lua)
  if path:find("%", 1, true) then
    if path:find("%%%X") or path:find("%%%x%X") or path:find("%%.?$") then
      return nil, "a malformed percent-escape"
    end
    decoded = path:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end)
  end
  if decoded:find("[%c #?]") then
    return nil, "a control character, space, '#' or '?' in the path"
  end
  local parts = {}
  local body = decoded:match("^/(.-)/?$")
  if body == nil then return nil, "a path that does not start with '/'" end
  if body == "" then return parts end
  for part in (body .. "/"):gmatch("([^/]*)/") do
    if part == "" or part == "." or part == ".." then
      return nil, "an empty, '.' or '..' segment"
    end
    parts[#parts + 1] = part
  end
  return parts
end

-- The request's attributes: { verb=, group=, version=, resource=,
-- subresource=, namespace=, name= }, or { non_resource = true, verb= } for
-- paths outside the resource tree (/version, discovery, /openapi), or
-- { unroutable = why, verb= } for a path split() cannot judge.
function request.attributes(method, path, query)
  local parts, why = split((path:gsub("%?.*$", "")))
  if parts == nil then return { unroutable = why, verb = method:lower(), path = path } end
  local group, version, rest
  if parts[1] == "api" and parts[2] then
    group, version, rest = "", parts[2], 3
  elseif parts[1] == "apis" and parts[3] then
    group, version, rest = parts[2], parts[3], 4
  end
  if group == nil or parts[rest] == nil then
    return { non_resource = true, verb = method:lower(), path = path }
  end
  local a = { group = group, version = version }
  local i = rest
  if parts[i] == "namespaces" and parts[i + 1] then
    a.namespace = parts[i + 1]
    if parts[i + 2] then
      i = i + 2
    else
      -- the namespace object itself: /api/v1/namespaces/NAME
      a.resource, a.name = "namespaces", parts[i + 1]
    end
  end
  if a.resource == nil then
    a.resource, a.name, a.subresource = parts[i], parts[i + 1], parts[i + 2]
  end
  if reads[method] then
    local watching = type(query) == "string" and query:find("watch=true", 1, true)
        or type(query) == "table" and (query.watch == "true" or query.watch == true)
    a.verb = a.name == nil and (watching and "watch" or "list") or "get"
  elseif method == "DELETE" then
    a.verb = a.name == nil and "deletecollection" or "delete"
  else
    a.verb = verbs[method] or method:lower()
  end
  return a
end

local function matches(p, a)
  if p.verb ~= "*" and p.verb ~= a.verb then return false end
  if (p.group or "") ~= "*" and (p.group or "") ~= a.group then return false end
  local resource, subresource = p.resource, p.subresource
  if subresource == nil and resource:find("/", 1, true) then
    resource, subresource = resource:match("^([^/]*)/(.*)$")
  end
  if resource ~= "*" and resource ~= a.resource then return false end
  if subresource ~= a.subresource and subresource ~= "*" then return false end
  if p.namespace ~= nil and p.namespace ~= a.namespace then return false end
  if p.name ~= nil and p.name ~= a.name then return false end
  return true
end

-- Does one of `permissions` (an array of { verb, group, resource,
-- subresource?, namespace?, name? }) cover the request? Requests outside the
-- resource tree are reads of discovery and version: allowed when they are
-- GETs.
function request.allowed(permissions, a)
  if a.unroutable then return false end
  if a.non_resource then return a.verb == "get" or a.verb == "head" end
  for _, p in ipairs(permissions) do
    if matches(p, a) then return true end
  end
  return false
end

-- The declaration that would cover the request, as a migration writes it.
function request.declaration(a)
  if a.non_resource then return ("a %s of %s (only reads are allowed outside the resource tree)")
      :format(a.verb:upper(), a.path) end
  local parts = { ("verb = %q"):format(a.verb), ("group = %q"):format(a.group),
    ("resource = %q"):format(a.resource) }
  if a.subresource then parts[#parts + 1] = ("subresource = %q"):format(a.subresource) end
  return "{ " .. table.concat(parts, ", ") .. " }"
end

-- Paths and queries -----------------------------------------------------------

local function urlescape(s)
  return (tostring(s):gsub("[^%w%-%._~]", function(c) return ("%%%02X"):format(c:byte()) end))
end
request.urlescape = urlescape

-- Query parameters in a fixed order: a list of { key, value } pairs.
local function encode_query(pairs_)
  local out = {}
  for _, kv in ipairs(pairs_) do
    if kv[2] ~= nil then out[#out + 1] = urlescape(kv[1]) .. "=" .. urlescape(kv[2]) end
  end
  return table.concat(out, "&")
end

local function query_table(pairs_)
  local t = {}
  for _, kv in ipairs(pairs_) do
    if kv[2] ~= nil then t[kv[1]] = kv[2] end
  end
  return t
end

request.encode_query = encode_query
request.query_table = query_table

return request
