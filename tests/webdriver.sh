# shellcheck shell=bash
# tests/webdriver.sh: a small WebDriver client (curl and jq) that drives
# Debian's chromium headless through Debian's chromedriver, for tests of
# pages served on loopback. Source it from bash; it sets no traps.
#
#   wd_start DIR       start chromedriver on a free loopback port and open a
#                      headless chromium session with a fresh profile in DIR.
#                      Returns 0; 77 when chromium or chromedriver is missing
#                      or cannot start here (the reason in WD_WHY, the
#                      driver's log in DIR/chromedriver.log); 1 otherwise.
#   wd_stop            end the session and chromedriver (safe to repeat).
#   wd_open URL        load URL.
#   wd_js BODY [ARG]   run BODY as a function in the page (ARG: arguments[0],
#                      a string); prints its return value as JSON.
#   wd_wait BODY [ARG] wd_js until it returns true, for at most WD_WAIT
#                      seconds (default 30); returns 1 if it never did.
#   wd_click CSS       click the element CSS selects.
#   wd_screenshot FILE save the window as PNG.
#   wd_fit WIDTH       make the window WIDTH wide and as tall as the page.
#
# Chromium runs as the machine allows it in a container, as root: no
# sandbox, no GPU, and none of its background connections (this machine's
# network is closed).

WD_PORT= WD_PID= WD_SESSION= WD_WHY=
WD_WAIT=${WD_WAIT:-30}
WD_BROWSER=${WD_BROWSER:-}

# wd_call METHOD PATH [JSON]: one WebDriver command; prints .value as JSON,
# fails on an error, with the driver's message in WD_WHY and on stderr (a
# caller's $(...) keeps no variable).
wd_call() {
    local out
    out=$(curl -sS --max-time 60 -X "$1" -H 'Content-Type: application/json' \
        ${3:+--data-binary "$3"} "http://127.0.0.1:$WD_PORT$2") || {
        WD_WHY="chromedriver did not answer $1 $2"
        echo "webdriver: $WD_WHY" >&2
        return 1
    }
    if jq -e '.value | type == "object" and has("error")' <<<"$out" >/dev/null 2>&1; then
        WD_WHY=$(jq -r '.value.error + ": " + (.value.message | split("\n")[0])' <<<"$out")
        echo "webdriver: $1 $2: $WD_WHY" >&2
        return 1
    fi
    jq -c '.value' <<<"$out"
}

# wd_start DIR: chromedriver and a browser session. A session start that
# fails (chromedriver or the browser gone, as on a loaded machine) is tried
# again with a fresh driver after a pause, five times in all; each failed
# try's driver log is kept as DIR/chromedriver.N.log.
wd_start() {
    local attempt rc=77
    for attempt in 1 2 3 4 5; do
        wd_start_once "$1"
        rc=$?
        [[ $rc == 77 && -n $WD_BROWSER && $WD_WHY == "chromium did not start"* ]] || break
        echo "webdriver: attempt $attempt: $WD_WHY" >&2
        cp "$1/chromedriver.log" "$1/chromedriver.$attempt.log" 2>/dev/null
        sleep "$attempt"
    done
    return "$rc"
}

wd_start_once() {
    local dir=$1 try
    for try in chromium chromium-browser; do
        [[ -z $WD_BROWSER ]] && WD_BROWSER=$(command -v "$try" || true)
    done
    if [[ -z $WD_BROWSER ]] || ! command -v chromedriver >/dev/null 2>&1; then
        WD_WHY="chromium or chromedriver not found (Debian packages: chromium chromium-driver)"
        return 77
    fi
    for tool in curl jq; do
        command -v "$tool" >/dev/null 2>&1 || { WD_WHY="$tool not found"; return 1; }
    done
    rm -rf "$dir/profile" && mkdir -p "$dir/profile" # a crashed try leaves its lock
    # A random port; another one when chromedriver cannot bind it.
    for try in 1 2 3 4 5; do
        WD_PORT=$((20000 + RANDOM % 30000))
        chromedriver --port="$WD_PORT" --log-path="$dir/chromedriver.log" >/dev/null 2>&1 &
        WD_PID=$!
        for _ in $(seq 50); do
            curl -s --max-time 2 "http://127.0.0.1:$WD_PORT/status" 2>/dev/null \
                | jq -e '.value.ready' >/dev/null 2>&1 && break 2
            kill -0 "$WD_PID" 2>/dev/null || break
            sleep 0.1
        done
        kill "$WD_PID" 2>/dev/null
        wait "$WD_PID" 2>/dev/null
        WD_PID=
    done
    if [[ -z $WD_PID ]]; then
        WD_WHY="chromedriver did not start (see $dir/chromedriver.log)"
        return 77
    fi
    local caps session
    caps=$(jq -nc --arg bin "$WD_BROWSER" --arg profile "$dir/profile" '{capabilities: {alwaysMatch: {
        browserName: "chrome",
        "goog:chromeOptions": {binary: $bin, args: [
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-dev-shm-usage", "--hide-scrollbars", "--window-size=1280,1200",
            ("--user-data-dir=" + $profile)]}}}}')
    if ! session=$(wd_call POST /session "$caps" 2>"$dir/session.err"); then
        # The browser itself would not start (no display libraries, a
        # container that forbids it, ...): nothing here can drive a page.
        WD_WHY="chromium did not start: $(cat "$dir/session.err")"
        wd_driver_gone "$dir"
        wd_stop
        return 77
    fi
    WD_SESSION=$(jq -r '.sessionId' <<<"$session")
    return 0
}

# wd_driver_gone DIR: when chromedriver has exited, adds its exit status and
# the last lines of its log to WD_WHY (why a session start found no driver).
wd_driver_gone() {
    local st
    kill -0 "$WD_PID" 2>/dev/null && return 0
    wait "$WD_PID" 2>/dev/null
    st=$?
    WD_PID=
    WD_WHY+="; chromedriver exited with status $st; the end of its log:
$(tail -n 5 "$1/chromedriver.log" 2>/dev/null | cut -c1-300)"
}

wd_stop() {
    if [[ -n $WD_SESSION ]]; then
        wd_call DELETE "/session/$WD_SESSION" >/dev/null 2>&1
        WD_SESSION=
    fi
    if [[ -n $WD_PID ]]; then
        kill "$WD_PID" 2>/dev/null
        wait "$WD_PID" 2>/dev/null
        WD_PID=
    fi
    return 0
}

wd_open() {
    wd_call POST "/session/$WD_SESSION/url" "$(jq -nc --arg u "$1" '{url: $u}')" >/dev/null
}

wd_js() {
    wd_call POST "/session/$WD_SESSION/execute/sync" \
        "$(jq -nc --arg s "$1" --arg a "${2:-}" '{script: $s, args: [$a]}')"
}

wd_wait() {
    local deadline=$((SECONDS + WD_WAIT)) v
    while ((SECONDS <= deadline)); do
        v=$(wd_js "$1" "${2:-}") && [[ $v == true ]] && return 0
        sleep 0.2
    done
    return 1
}

# (Finds the element again when the page replaced it in between.)
wd_click() {
    local el id try
    for try in 1 2 3 4 5; do
        el=$(wd_call POST "/session/$WD_SESSION/element" \
            "$(jq -nc --arg v "$1" '{using: "css selector", value: $v}')") || return 1
        id=$(jq -r 'to_entries[0].value' <<<"$el")
        wd_call POST "/session/$WD_SESSION/element/$id/click" '{}' >/dev/null && return 0
        [[ $WD_WHY == "stale element reference"* ]] || return 1
    done
    return 1
}

wd_screenshot() {
    wd_call GET "/session/$WD_SESSION/screenshot" | jq -r '.' | base64 -d >"$1"
}

wd_fit() {
    local h
    h=$(wd_js 'return document.documentElement.scrollHeight') || return 1
    # Through the DevTools protocol: a headless window is no taller than
    # its screen.
    wd_call POST "/session/$WD_SESSION/goog/cdp/execute" "$(jq -nc --argjson w "$1" --argjson h "$h" \
        '{cmd: "Emulation.setDeviceMetricsOverride",
          params: {width: $w, height: $h, deviceScaleFactor: 1, mobile: false}}')" >/dev/null
}
