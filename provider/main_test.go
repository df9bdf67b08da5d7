package provider_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/hashicorp/terraform-plugin-framework/providerserver"
	"github.com/hashicorp/terraform-plugin-go/tfprotov6"

	"github.com/takoform/terraform-provider-takoform/internal/testdb"
	"github.com/takoform/terraform-provider-takoform/provider"
)

// providerDir holds the provider binary built for the raw-CLI tests; the CLIs find it through
// dev_overrides, exactly as a provider developer runs one.
var providerDir string

// accCLI is the CLI this test process runs acceptance tests under.
var accCLI cli

// factories serve the provider in-process to terraform-plugin-testing.
var factories = map[string]func() (tfprotov6.ProviderServer, error){
	"takoform": providerserver.NewProtocol6WithError(provider.New("test")()),
}

// TestMain runs the acceptance tests under one CLI per process: the pinned OpenTofu in this one,
// and, when terraform is on PATH, terraform in a child process run at the same time
// (terraform-plugin-testing reads its CLI from the environment, so one process serves one CLI).
// TAKOFORM_ACC_CLIS=tofu (or terraform) runs only that one.
func TestMain(m *testing.M) {
	which := os.Getenv("TAKOFORM_ACC_CLI")
	if which == "" {
		only := os.Getenv("TAKOFORM_ACC_CLIS")
		_, tfErr := exec.LookPath("terraform")
		if only != "" || tfErr != nil {
			which = "tofu"
			if only == "terraform" {
				which = "terraform"
			}
		} else {
			os.Exit(fanOut())
		}
	}
	c, err := setupCLI(which)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		if os.Getenv("CI") != "" {
			os.Exit(1)
		}
	}
	accCLI = c
	dir, err := os.MkdirTemp("", "takoform-provider-")
	if err != nil {
		panic(err)
	}
	providerDir = dir
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "terraform-provider-takoform"), "..")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build provider:", err)
		os.Exit(1)
	}
	testdb.Main(m)
}

// fanOut runs this test binary twice at once, once per CLI, streaming the OpenTofu run and
// printing the terraform run after it, and returns a failing code if either failed.
func fanOut() int {
	tf, err := os.CreateTemp("", "takoform-acc-terraform-*.log")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.Remove(tf.Name())
	runs := map[string]*exec.Cmd{}
	for _, which := range []string{"tofu", "terraform"} {
		cmd := exec.Command(os.Args[0], os.Args[1:]...)
		cmd.Env = append(os.Environ(), "TAKOFORM_ACC_CLI="+which)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if which == "terraform" {
			cmd.Stdout, cmd.Stderr = tf, tf
		}
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "start the", which, "run:", err)
			return 1
		}
		runs[which] = cmd
	}
	code := 0
	if err := runs["tofu"].Wait(); err != nil {
		code = 1
	}
	err = runs["terraform"].Wait()
	tf.Close()
	out, _ := os.ReadFile(tf.Name())
	fmt.Printf("\n=== the same tests under terraform (TAKOFORM_ACC_CLI=terraform)\n%s", out)
	if err != nil {
		code = 1
	}
	return code
}

// cli is one Terraform-compatible binary to test against.
type cli struct {
	name string
	path string
}

// setupCLI points terraform-plugin-testing at the CLI, with the environment SPEC 4 names.
func setupCLI(which string) (cli, error) {
	rc, err := os.CreateTemp("", "takoform-empty-*.tfrc")
	if err == nil {
		rc.Close()
		os.Setenv("TF_CLI_CONFIG_FILE", rc.Name())
	}
	os.Setenv("CHECKPOINT_DISABLE", "1")
	os.Setenv("TF_ACC_PROVIDER_NAMESPACE", "takoform")
	switch which {
	case "terraform":
		p, err := exec.LookPath("terraform")
		if err != nil {
			return cli{}, fmt.Errorf("no terraform on PATH")
		}
		os.Setenv("TF_ACC_TERRAFORM_PATH", p)
		os.Unsetenv("TF_ACC_PROVIDER_HOST")
		return cli{"terraform", p}, nil
	default:
		tofu := os.Getenv("TAKOFORM_TOFU")
		if tofu == "" {
			if p, err := filepath.Abs("../.tools/bin/tofu"); err == nil {
				if _, err := os.Stat(p); err == nil {
					tofu = p
				}
			}
		}
		if tofu == "" {
			if p, err := exec.LookPath("tofu"); err == nil {
				tofu = p
			}
		}
		if tofu == "" {
			return cli{}, fmt.Errorf("no OpenTofu: run tools/opentofu.sh (CI=true never skips acceptance tests)")
		}
		os.Setenv("TF_ACC_TERRAFORM_PATH", tofu)
		os.Setenv("TF_ACC_PROVIDER_HOST", "registry.opentofu.org")
		return cli{"tofu", tofu}, nil
	}
}
