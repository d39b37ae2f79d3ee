#!/usr/bin/env bash
# tests/check_docs.sh [ROOT]: documents and comments cite only what exists.
#
# Reads the tree at ROOT (default: the source tree this script sits in) at
# run time: the files are `git ls-files` (tracked and untracked, not ignored)
# when ROOT is a git work tree, else every file under it. Scanned:
#   documents, whole: *.md anywhere, man/*;
#   comments only (/* */ and // in .c .h .js .css, -- and /* */ in .sql,
#   # in .sh .py and quickstart) of the files under lib/ schema/ include/
#   cli/ bench/ tests/ migrations/ examples/ fuzz/; tests/fixtures/ is
#   third-party data and is not read.
# Each finding is printed as FILE:LINE: (rule) what; the exit status is 1 if
# there is one, else 0. The rules:
#   (a) no commit hash: a word of 7-40 lowercase hex digits with at least one
#       digit and one letter a-f. Not a hash: a word joined to another by a
#       hyphen (UUIDs, "0190c2a4-..."), 0x constants and \x escapes (no word
#       boundary), decimal exponents such as 1e1000000, and ALLOW_HEX below.
#   (b) no missing file: a path that starts with one of ROOT's top-level
#       directories (schema/poll.sql, docs/, tests/test_poll, schema/poll)
#       must name a file or directory, a glob that matches, the stem of a
#       file (schema/poll for schema/poll.sql), or a word of Makefile.am
#       (what the build makes or cleans). A relative Markdown link in a
#       document must exist from the document's folder, and a bare file
#       name ending in .md must exist at ROOT, in docs/ or beside its citer.
#   (c) no missing section: "DESIGN.md section N" and "section N of
#       DESIGN.md" need a heading "## N. ..." in DESIGN.md; a document
#       followed by a comma and a quoted name (DESIGN.md, "Chains") or a
#       bare one that ends at ")" or ";" ((DESIGN.md, Plans)) needs a heading
#       of that document (its "N. " dropped) or a bold lead-in (**Chains.**)
#       of that name, case and spacing aside.
#   (d) no missing migration: "migration" or "migrations" followed by a
#       four-digit number or range, or "CHANGELOG, " and such a number, need
#       a file in migrations/ whose name starts with each number. There is
#       no exception: release 0.1.0's numbered development steps are not in
#       the tree, so a 0.1.0 database is named by its schema version (17).
#
# tests/check_docs.sh --self-test runs the checker on a scratch tree with one
# fault of each kind and fails unless every one is reported and a clean tree
# passes; a plain run does this first, so make check proves the check can
# fail. make check-docs runs this script.

set -u

# Words of hex that are not commit hashes (none today).
ALLOW_HEX=""

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

check_tree() {
    ALLOW_HEX="$ALLOW_HEX" perl -CSD -e '
use strict;
use warnings;
use File::Find;

my $root = shift @ARGV;
chdir $root or die "check_docs: cannot enter $root\n";
my %allow = map { $_ => 1 } split " ", ($ENV{ALLOW_HEX} // "");

# The file list, read now, never written down here.
my @files;
if (-e ".git" && system("git rev-parse --is-inside-work-tree >/dev/null 2>&1") == 0) {
    @files = grep { -f $_ } split /\0/, `git ls-files -z --cached --others --exclude-standard`;
} else {
    find({ no_chdir => 1, wanted => sub { push @files, substr($File::Find::name, 2) if -f $_ } }, ".");
}
my %top;
for (@files) { $top{$1} = 1 if m{^([^/]+)/} and $1 !~ /^\./ }
my $topre = join "|", map { quotemeta } sort keys %top;
my $makefile = -f "Makefile.am" ? slurp("Makefile.am") : "";
my %made = map { $_ => 1 } ($makefile =~ /([\w.\/-]+)/g);

sub globs { my @g = glob $_[0]; return scalar @g }

sub slurp {
    my ($f) = @_;
    open my $fh, "<:encoding(UTF-8)", $f or return "";
    local $/;
    my $s = <$fh>;
    return defined $s ? $s : "";
}

# Headings and bold lead-ins of a document, lower case, spaces squeezed.
my %names_of;
my %sections;
sub names_of {
    my ($doc) = @_;
    return $names_of{$doc} if $names_of{$doc};
    my %n;
    for my $line (split /\n/, slurp($doc)) {
        if ($line =~ /^#+\s+(?:(\d+)\.\s+)?(.*?)\s*$/) {
            $n{lc $2} = 1;
            $sections{$doc}{$1} = 1 if defined $1;
        }
        $n{lc $1} = 1 if $line =~ /^(?:- )?\*\*(.+?)\.?\*\*/;
    }
    return $names_of{$doc} = \%n;
}

my $bad = 0;
sub report {
    my ($file, $line, $msg) = @_;
    print "$file:$line: $msg\n";
    $bad++;
}

# Text to scan as [line, text] pieces: a document whole, else its comments.
sub comments {
    my ($file, $src) = @_;
    my @out;
    my $line = 1;
    my $kind = $file =~ /\.(c|h|js|css)$/ ? "c"
             : $file =~ /\.sql$/ ? "sql"
             : ($file =~ /\.(sh|py)$/ || $file =~ m{(^|/)quickstart$}) ? "hash" : "";
    return () unless $kind;
    if ($kind eq "hash") {
        for my $l (split /\n/, $src, -1) {
            push @out, [$line, $1] if $l =~ /(?:^|\s)#(?!!)(.*)$/;
            $line++;
        }
        return @out;
    }
    my $re = $kind eq "c"
        ? qr{\G(?:(/\*.*?\*/)|(//[^\n]*)|("(?:\\.|[^"\\\n])*")|(\x27(?:\\.|[^\x27\\\n])*\x27)|([^/"\x27]+|.))}s
        : qr{\G(?:(/\*.*?\*/)|(--[^\n]*)|("[^"]*")|(\x27(?:\x27\x27|[^\x27])*\x27)|([^/"\x27-]+|.))}s;
    while ($src =~ /$re/gc) {
        my $tok = $&;
        if (defined $1 || defined $2) {
            my $n = $line;
            for my $l (split /\n/, $tok, -1) {
                $l =~ s{^\s*(?:/\*+|\*+/?|//+|--+)?\s?}{};
                $l =~ s{\*+/\s*$}{};
                push @out, [$n++, $l];
            }
        }
        $line += ($tok =~ tr/\n//);
    }
    return @out;
}

sub check_text {
    my ($file, $pieces, $is_doc) = @_;
    return unless @$pieces;
    # One text, with the line of every offset, so a citation may span lines.
    my $text = "";
    my @starts;
    for my $p (@$pieces) {
        push @starts, [length $text, $p->[0]];
        $text .= $p->[1] . "\n";
    }
    my $line_at = sub {
        my ($off) = @_;
        my $ln = $starts[0][1];
        for my $s (@starts) { last if $s->[0] > $off; $ln = $s->[1]; }
        return $ln;
    };
    (my $dir = $file) =~ s{[^/]*$}{};

    # (a) commit hashes
    while ($text =~ /(?<![\w-])([0-9a-f]{7,40})(?![\w-])/g) {
        my ($w, $off) = ($1, $-[1]);
        next unless $w =~ /\d/ && $w =~ /[a-f]/;
        next if $w =~ /^\d+e\d+$/ || $allow{$w};
        report($file, $line_at->($off), "(a) names a commit hash: $w");
    }

    # (b) repository paths
    if ($topre ne "") {
        while ($text =~ m{(?<![\w./\x27-])((?:$topre)/[\w.*/-]*)}g) {
            my ($p, $off) = ($1, $-[1]);
            $p =~ s/[.]+$//;
            next if $p =~ m{/\.\.?(/|$)};
            my $ok = $p =~ /[*?]/ ? globs($p)
                   : -e $p || globs("$p.*") || $made{$p};
            report($file, $line_at->($off), "(b) cites a missing path: $p") unless $ok;
        }
    }
    if ($is_doc) {
        while ($text =~ /\]\(([^)\s#]+)(?:#[^)]*)?\)/g) {
            my ($l, $off) = ($1, $-[1]);
            next if $l =~ /^[a-z]+:/;
            report($file, $line_at->($off), "(b) links to a missing file: $l")
                unless -e "$dir$l";
        }
    }
    while ($text =~ /(?<![\w.\/\x27(-])([\w-]+\.md)\b/g) {
        my ($m, $off) = ($1, $-[1]);
        report($file, $line_at->($off), "(b) cites a missing document: $m")
            unless -e $m || -e "docs/$m" || -e "$dir$m";
    }

    # (c) sections of documents
    names_of("DESIGN.md") if -f "DESIGN.md";
    for my $re (qr/\bDESIGN\.md(?:\]\([^)]*\))?,?\s+section\s+(\d+)/,
                qr/\bsection\s+(\d+)\s+of\s+\[?DESIGN\.md/) {
        while ($text =~ /$re/g) {
            my ($n, $off) = ($1, $-[1]);
            report($file, $line_at->($off), "(c) cites a missing section: DESIGN.md section $n")
                unless $sections{"DESIGN.md"}{$n};
        }
    }
    while ($text =~ /\b([\w\/.-]*?([\w-]+\.md))(?:\]\(([^)]*)\))?,\s*(?:"([^"]+)"|([A-Za-z][\w ]*?)\s*[);])/g) {
        my ($shown, $base, $link, $q, $bare, $off) = ($1, $2, $3, $4, $5, $-[1]);
        my $name = defined $q ? $q : $bare;
        next if $name =~ /^section\s/i;
        next if !defined $q && $name =~ /^(see|and|or|the design|for|which)\b/i && $name !~ /^the SQL/i;
        my $doc = defined $link ? "$dir$link" : (-e "$dir$shown" ? "$dir$shown" : -e $shown ? $shown : "docs/$base");
        $doc =~ s/#.*//;
        next unless -f $doc;
        (my $key = lc $name) =~ s/\s+/ /g;
        report($file, $line_at->($off), "(c) cites a missing section of $base: \"$name\"")
            unless names_of($doc)->{$key};
    }

    # (d) migrations
    while ($text =~ /\b(?:migrations?\s+|CHANGELOG(?:\.md)?,\s*)(\d{4})(?:\s*(?:\x{2013}|-|to)\s*(\d{4}))?\b/gi) {
        my $off = $-[1];
        for my $n (grep { defined } $1, $2) {
            report($file, $line_at->($off), "(d) names migration $n, which is not in migrations/")
                unless globs("migrations/$n*");
        }
    }
}

my $scan_dirs = qr{^(lib|schema|include|cli|bench|tests|migrations|examples|fuzz)/};
for my $f (sort @files) {
    next if $f =~ m{^tests/fixtures/};
    if ($f =~ /\.md$/ || $f =~ m{^man/}) {
        my $n = 0;
        check_text($f, [map { [++$n, $_] } split /\n/, slurp($f), -1], 1);
    } elsif (($f =~ $scan_dirs || $f eq "quickstart") && $f =~ m{(\.(c|h|js|css|sql|sh|py)|^quickstart)$}) {
        check_text($f, [comments($f, slurp($f))], 0);
    }
}
print "check_docs: ", scalar(@files), " files read, $bad finding", ($bad == 1 ? "" : "s"), "\n";
exit($bad ? 1 : 0);
' "$1"
}

self_test() {
    local t rc out fails=0
    t=$(mktemp -d) || return 1
    mkdir -p "$t/lib" "$t/schema" "$t/docs" "$t/migrations"
    printf '# d\n\n## 1. The house\n\n- **Chains.** x\n' >"$t/DESIGN.md"
    printf -- '-- see lib/ok.c and DESIGN.md section 1 and (DESIGN.md, "Chains")\n' >"$t/schema/ok.sql"
    printf '/* uuid 0f8fad5b-d9cb-469f-a165-70867728950e, 0x1f2e3d4c, 1e1000000 */\nint x;\n' >"$t/lib/ok.c"
    printf 'Text with [a link](../DESIGN.md) and `schema/ok.sql`.\n' >"$t/docs/ok.md"
    out=$(check_tree "$t" 2>&1) || { echo "self-test: a clean tree failed:"; echo "$out"; fails=1; }
    printf 'int y; /* fixed in 9d0ed81 */\n' >"$t/lib/bad.c"
    printf -- '-- see schema/gone.sql (migration 0017; DESIGN.md, Security) and DESIGN.md section 9\n' >"$t/schema/bad.sql"
    printf 'Line one.\n[gone](gone.md)\n' >"$t/docs/bad.md"
    out=$(check_tree "$t" 2>&1)
    rc=$?
    for want in "lib/bad.c:1: (a) names a commit hash: 9d0ed81" \
        "schema/bad.sql:1: (b) cites a missing path: schema/gone.sql" \
        "schema/bad.sql:1: (d) names migration 0017" \
        "schema/bad.sql:1: (c) cites a missing section of DESIGN.md: \"Security\"" \
        "schema/bad.sql:1: (c) cites a missing section: DESIGN.md section 9" \
        "docs/bad.md:2: (b) links to a missing file: gone.md"; do
        grep -qF "$want" <<<"$out" || { echo "self-test: not reported: $want"; fails=1; }
    done
    ((rc != 0)) || { echo "self-test: a faulty tree passed"; fails=1; }
    rm -rf "$t"
    if ((fails)); then echo "$out"; return 1; fi
    echo "check_docs: self-test passed (a clean tree passes, each fault is named)"
}

if [[ ${1:-} == --self-test ]]; then
    self_test
    exit
fi
self_test || exit 1
check_tree "${1:-$here/..}"
