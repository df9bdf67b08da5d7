package main_test

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

// repoRoot is the repository's top directory, from this package's.
const repoRoot = "../../.."

// The shipped systemd units start takoserver with flags it has: each ExecStart, run with --help
// added, parses. Where systemd-analyze is installed, each unit also verifies (with the binary at
// the path the unit names replaced by the one under test).
func TestTheShippedUnitsStartWithFlagsThatExist(t *testing.T) {
	t.Parallel()
	units, err := filepath.Glob(filepath.Join(repoRoot, "deploy/systemd/*.service"))
	require.NoError(t, err)
	require.Len(t, units, 2)
	verify, _ := exec.LookPath("systemd-analyze")
	for _, unit := range units {
		text, err := os.ReadFile(unit)
		require.NoError(t, err)
		exec := regexp.MustCompile(`(?m)^ExecStart=(\S+) (.*)$`).FindStringSubmatch(string(text))
		require.NotNil(t, exec, unit)
		require.Equal(t, "/usr/local/bin/takoserver", exec[1], unit)
		args := append(strings.Fields(exec[2]), "--help")
		out, errOut, err := runRaw("", args...)
		require.NoError(t, err, "%s: takoserver %s: %s", unit, strings.Join(args, " "), errOut)
		require.Contains(t, out, "Usage:", unit)
		if verify == "" {
			continue
		}
		dir := t.TempDir()
		local := filepath.Join(dir, filepath.Base(unit))
		require.NoError(t, os.WriteFile(local, []byte(strings.ReplaceAll(string(text), "/usr/local/bin/takoserver", binary)), 0o600))
		// The units it needs (a socket unit) beside it.
		sockets, err := filepath.Glob(filepath.Join(filepath.Dir(unit), "*.socket"))
		require.NoError(t, err)
		for _, s := range sockets {
			b, err := os.ReadFile(s)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(dir, filepath.Base(s)), b, 0o600))
		}
		b, err := runCommand(verify, "verify", local)
		require.NoError(t, err, "systemd-analyze verify %s:\n%s", unit, b)
	}
}

// Every metric the shipped alert rules read is one the code defines (a rule on a name nobody
// exports never fires). Where promtool is installed, the rules also pass promtool check rules.
func TestTheShippedAlertRulesReadMetricsTheCodeExports(t *testing.T) {
	t.Parallel()
	rules := filepath.Join(repoRoot, "deploy/prometheus/takoform-alerts.yml")
	text, err := os.ReadFile(rules)
	require.NoError(t, err)
	var doc struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	require.NoError(t, yaml.Unmarshal(text, &doc))
	defined := definedMetrics(t)
	names := regexp.MustCompile(`\b(?:takoserver|takoform)_[a-z0-9_]+`)
	count := 0
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Alert)
			count++
			for _, name := range names.FindAllString(r.Expr, -1) {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
				require.True(t, defined[name] || defined[base], "alert %s reads %s, which no code defines", r.Alert, name)
			}
		}
	}
	require.GreaterOrEqual(t, count, 10)
	if promtool, err := exec.LookPath("promtool"); err == nil {
		b, err := runCommand(promtool, "check", "rules", rules)
		require.NoError(t, err, "promtool check rules:\n%s", b)
	}
}

// definedMetrics are the metric names the repository's Go code (tests aside) defines, as the
// string literal of a collector's Name or a Desc.
func definedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	literal := regexp.MustCompile(`(?:Name:\s*|NewDesc\()"((?:takoserver|takoform)_[a-z0-9_]+)"`)
	out := map[string]bool{}
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && slices.Contains([]string{".git", ".tools", "node_modules"}, d.Name()) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range literal.FindAllStringSubmatch(string(b), -1) {
			out[m[1]] = true
		}
		return nil
	})
	require.NoError(t, err)
	require.True(t, out["takoserver_http_requests_total"], "the search finds the Host's metrics")
	return out
}

func runCommand(name string, args ...string) (string, error) {
	b, err := exec.Command(name, args...).CombinedOutput()
	return string(b), err
}
