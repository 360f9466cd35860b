-- Files and processes for specs: the one copy of read/write/tmpdir/quote
-- (pure Lua, no engine module: spec/support/fake.lua uses it under a plain
-- lua5.4 too).
local files = {}

-- Shell quoting: one argument, whatever it holds.
function files.quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end
local q = files.quote

-- The whole file, or nil when it cannot be opened.
function files.read(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local data = f:read("a")
  f:close()
  return data
end

-- Writes (replaces) a file; raises when it cannot.
function files.write(path, data)
  local f = assert(io.open(path, "wb"))
  assert(f:write(data))
  assert(f:close())
end

-- The JSON text of bench/fleet.lua's fleet of n VMs (a List: the VMs, their
-- VMIs and the rest of migration 59's benchmark fleet), made by the engine's
-- binary ($COZY_MIGRATE_BIN); raises when it cannot be made.
function files.fleet_json(n)
  local dir = files.tmpdir("fleet")
  local path = dir .. "/fleet.json"
  local bin = os.getenv("COZY_MIGRATE_BIN") or "build/cozy-migrate"
  local code = files.sh(("%s lua bench/fleet.lua %s %d >/dev/null"):format(q(bin), q(path), n))
  local text = files.read(path)
  files.rm_rf(dir)
  assert(code == 0 and text, "bench/fleet.lua did not write a fleet of " .. n .. " VMs")
  return text
end

-- Runs a shell command; returns its exit status (128 + N for signal N).
function files.sh(cmd)
  local ok, how, code = os.execute(cmd)
  if how == "exit" then return code end
  return ok and 0 or 128 + (code or 0)
end

-- A command's stdout.
function files.capture(cmd)
  local p = assert(io.popen(cmd, "r"))
  local out = p:read("a")
  p:close()
  return out
end

-- A fresh temporary directory (the caller removes it, files.rm_rf).
function files.tmpdir(prefix)
  local dir = files.capture("mktemp -d -t " .. q((prefix or "cozy-spec") .. ".XXXXXX")):gsub("%s+$", "")
  assert(dir ~= "", "mktemp failed")
  return dir
end

-- Removes a temporary tree; refuses anything that is not one (a spec bug
-- must not remove the source tree).
function files.rm_rf(dir)
  local tmp = (os.getenv("TMPDIR") or "/tmp"):gsub("/+$", "")
  assert(type(dir) == "string" and not dir:match("%.%.") and (dir:sub(1, #tmp + 1) == tmp .. "/"
    or dir:match("^/tmp/.")), "rm_rf: not a temporary directory: " .. tostring(dir))
  files.sh("rm -rf " .. q(dir))
end

-- `path` made absolute against the current directory (a spec runs from the
-- repository root; a child it starts elsewhere needs the binary's full path).
function files.absolute(path)
  if path:sub(1, 1) == "/" then return path end
  return (os.getenv("PWD") or files.capture("pwd"):gsub("%s+$", "")) .. "/" .. path
end

-- The lines of a text, without their newlines.
function files.lines(text)
  local out = {}
  for line in text:gmatch("[^\n]+") do out[#out + 1] = line end
  return out
end

return files
